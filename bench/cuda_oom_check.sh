# The CUDA out-of-memory refusal on the device: tiny_classifier at a batch whose plan exceeds the GPU must be refused
# before anything is allocated, naming the need, the free memory and a change that fits; the change it names must then
# run. Run on the device from the repository root with the stripped build in .dev/bundle.tar.xz and
# shared/device/env.sh in .dev/.
set -u
tar xJf .dev/bundle.tar.xz -C /tmp && export ONNXPIPE_BUNDLE=/tmp/bundle && . .dev/env.sh > /dev/null
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
mkdir -p /tmp/d && /opt/torch/.venv/bin/python -c "
import numpy as np
n=262144; r=np.random.default_rng(0)
np.save('/tmp/d/tokens.npy', r.integers(0,2000,size=(n,64)).astype(np.int64)); np.save('/tmp/d/labels.npy', r.integers(0,2,size=(n,)).astype(np.int64))"
B=/tmp/bundle/bin/onnxpipe
A="train models/tiny_classifier.onnx --data /tmp/d --batch 262144 --steps 1 --lr 1e-3 --backend cuda"
echo "== batch 262144"; /usr/bin/time -f "%e s" $B $A > /tmp/oom.out 2>&1; echo rc=$?; tail -6 /tmp/oom.out
fix=$(sed -n 's/.*the smallest change that fits: \(.*\) (the plan then needs.*/\1/p' /tmp/oom.out | head -1)
echo "== batch 262144 $fix"; /usr/bin/time -f "%e s" $B $A $fix 2>&1 | tail -3; echo rc=${PIPESTATUS[0]}
nvidia-smi --query-gpu=memory.used --format=csv,noheader
