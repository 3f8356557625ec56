# Item 9 of the multi-process issue on the one lent GPU: the NCCL comm with one rank, and CPU-transport ranks sharing
# the GPU against the one-process losses. Run on the device from the repository root with the stripped build packed in
# .dev/bundle.tar.xz and shared/device/env.sh copied to .dev/ (shared/device/README.md); writes into $OUT.
set -u
tar xJf .dev/bundle.tar.xz -C /tmp && export ONNXPIPE_BUNDLE=/tmp/bundle && . .dev/env.sh > /dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
B=/tmp/bundle/bin/onnxpipe
A="train models/tiny_gpt.onnx --data models/golden/tiny_gpt/data --batch 8 --steps 6 --optimizer adamw --lr 1e-3 --logits logits --freeze attn\.mask$ --backend cuda --no-cuda-graphs"
echo "== nccl test"; /tmp/bundle/bin/cuda_nccl_test 2>&1 | tail -4
echo "== cuda single";  $B $A --metrics $OUT/single.jsonl > $OUT/single.out 2>&1; echo rc=$?
echo "== cuda nccl world of one";  $B $A --comm nccl --metrics $OUT/nccl1.jsonl > $OUT/nccl1.out 2>&1; echo rc=$?; tail -3 $OUT/nccl1.out
echo "== cuda in-process 2 stages"; $B $A --stages 2 --microbatches 2 --metrics $OUT/k2.jsonl > $OUT/k2.out 2>&1; echo rc=$?
echo "== cuda 2 processes, tcp, one GPU"; $B launch --nproc 2 -- $A --device 0 --comm tcp --stages 2 --microbatches 2 --metrics $OUT/k2p.jsonl > $OUT/k2p.out 2>&1; echo rc=$?; tail -3 $OUT/k2p.out
echo "== cuda 2 data-parallel processes, nccl, one GPU (NCCL refuses 2 ranks on 1 GPU)"; timeout 60 $B launch --nproc 2 -- $A --device 0 --comm nccl --data-parallel 2 --rendezvous-timeout 20 > $OUT/d2n.out 2>&1; echo rc=$?; tail -4 $OUT/d2n.out
echo "== cuda 2 data-parallel processes, tcp, one GPU"; $B launch --nproc 2 -- $A --device 0 --comm tcp --data-parallel 2 --metrics $OUT/d2t.jsonl > $OUT/d2t.out 2>&1; echo rc=$?
$B $A --microbatches 2 --metrics $OUT/m2.jsonl > $OUT/m2.out 2>&1
for p in "single nccl1" "k2 k2p" "m2 d2t"; do set -- $p; if cmp -s <(cut -d, -f1-4 $OUT/$1.jsonl) <(cut -d, -f1-4 $OUT/$2.jsonl); then echo "$1 = $2 bitwise"; else echo "$1 != $2"; paste -d'\n' $OUT/$1.jsonl $OUT/$2.jsonl | head -4; fi; done
