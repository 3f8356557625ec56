#include "executor/backend/recording_backend.h"

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <variant>

#include "frontend/ir/status.h"

namespace onnxpipe::backend {
namespace {

using Call = std::function<absl::Status()>;

// Set while this thread records on one of the backend's streams (Allocate then fails, as
// cudaMalloc does inside a thread-local capture).
thread_local int recording_streams = 0;

class RecordedGraph : public Graph {
 public:
  explicit RecordedGraph(std::vector<Call> calls) : calls_(std::move(calls)) {}
  absl::Status Launch(Stream*) override {
    for (const Call& c : calls_) RETURN_IF_ERROR(c());
    return absl::OkStatus();
  }

 private:
  std::vector<Call> calls_;
};

class RecordingStream : public Stream {
 public:
  explicit RecordingStream(std::unique_ptr<Stream> inner) : inner_(std::move(inner)) {}
  ~RecordingStream() override {
    if (recording_) --recording_streams;
  }
  Stream* inner() const { return inner_.get(); }
  // The calls recorded so far; null when not recording.
  std::vector<Call>* tape() { return recording_ ? &tape_ : nullptr; }
  // While recording: keeps `bytes` at `at` as they are before a recorded call writes them, to be put
  // back at EndCapture (a capture runs nothing).
  void Save(const void* at, int64_t bytes) {
    if (!recording_ || at == nullptr || bytes <= 0) return;
    const auto* p = static_cast<const uint8_t*>(at);
    undo_.emplace_back(const_cast<uint8_t*>(p), std::vector<uint8_t>(p, p + bytes));
  }
  // A call the capture refuses: it ends up failing EndCapture too, as a CUDA capture is invalidated.
  void Invalidate(const std::string& why) {
    if (recording_ && invalid_.empty()) invalid_ = why;
  }

  absl::Status Synchronize() override {
    RETURN_IF_ERROR(Refuse("Synchronize"));
    return inner_->Synchronize();
  }
  absl::StatusOr<std::shared_ptr<Event>> Record() override {
    RETURN_IF_ERROR(Refuse("Record"));
    return inner_->Record();
  }
  absl::Status Wait(const Event& event) override {
    RETURN_IF_ERROR(Refuse("Wait"));
    return inner_->Wait(event);
  }
  absl::StatusOr<std::shared_ptr<Event>> RecordTimed() override {
    RETURN_IF_ERROR(Refuse("RecordTimed"));
    return inner_->RecordTimed();
  }
  absl::StatusOr<double> SecondsBetween(const Event& start, const Event& end) override {
    return inner_->SecondsBetween(start, end);
  }
  absl::Status BeginCapture() override {
    if (recording_) return FAILED_PRECONDITION() << "BeginCapture: the stream is already capturing";
    recording_ = true;
    ++recording_streams;
    tape_.clear();
    undo_.clear();
    invalid_.clear();
    return absl::OkStatus();
  }
  // The recorded calls ran while recording (the kernels had to, to return their outputs); their
  // writes are undone here, then the graph runs once: as a CUDA capture, whose work first runs here.
  absl::StatusOr<std::unique_ptr<Graph>> EndCapture() override {
    if (!recording_) return FAILED_PRECONDITION() << "EndCapture: the stream is not capturing";
    Stop();
    auto graph = std::make_unique<RecordedGraph>(std::move(tape_));
    tape_.clear();
    if (!invalid_.empty()) return FAILED_PRECONDITION() << "the capture was invalidated: " << invalid_;
    RETURN_IF_ERROR(graph->Launch(this));
    return graph;
  }
  // Drops the recording: its writes are undone and nothing runs.
  absl::Status AbortCapture() override {
    if (!recording_) return FAILED_PRECONDITION() << "AbortCapture: the stream is not capturing";
    Stop();
    tape_.clear();
    invalid_.clear();
    return absl::OkStatus();
  }
  absl::Status Refuse(const char* what) {
    if (!recording_) return absl::OkStatus();
    const std::string why = std::string(what) + " is not permitted while the stream is capturing a graph";
    Invalidate(why);
    return FAILED_PRECONDITION() << why;
  }

 private:
  // Ends recording, putting back every byte the recorded calls wrote.
  void Stop() {
    recording_ = false;
    --recording_streams;
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) std::copy(it->second.begin(), it->second.end(), it->first);
    undo_.clear();
  }

  std::unique_ptr<Stream> inner_;
  bool recording_ = false;
  std::vector<Call> tape_;
  std::vector<std::pair<uint8_t*, std::vector<uint8_t>>> undo_;
  std::string invalid_;
};

// One answer of an OutputAllocator to a kernel.
using Answer = std::variant<ir::Tensor, void*, bool>;

// Forwards to the driver's allocator and keeps its answers, in order, and the bytes they held
// before the kernel writes them (RecordingStream::Save).
class LoggingAllocator : public ir::OutputAllocator {
 public:
  LoggingAllocator(ir::OutputAllocator* real, RecordingStream* stream) : real_(real), stream_(stream) {}
  absl::StatusOr<ir::Tensor> Allocate(const ir::Node& node, int index, ir::DType dtype,
                                      const std::vector<int64_t>& dims) override {
    return Keep(real_->Allocate(node, index, dtype, dims));
  }
  absl::StatusOr<ir::Tensor> AllocateUninitialized(const ir::Node& node, int index, ir::DType dtype,
                                                   const std::vector<int64_t>& dims) override {
    return Keep(real_->AllocateUninitialized(node, index, dtype, dims));
  }
  bool SharesInputBuffer(const ir::Node& node, int index) const override {
    const bool shares = real_->SharesInputBuffer(node, index);
    answers_.emplace_back(shares);
    return shares;
  }
  absl::StatusOr<void*> Workspace(const ir::Node& node, int64_t bytes) override {
    absl::StatusOr<void*> w = real_->Workspace(node, bytes);
    if (w.ok()) {
      stream_->Save(*w, bytes);
      answers_.emplace_back(*w);
    }
    return w;
  }
  std::vector<Answer> answers() && { return std::move(answers_); }

 private:
  absl::StatusOr<ir::Tensor> Keep(absl::StatusOr<ir::Tensor> t) {
    if (t.ok()) {
      stream_->Save(t->address(), t->has_data() ? t->num_bytes() : 0);
      answers_.emplace_back(Unowned(*t));
    }
    return t;
  }
  ir::OutputAllocator* real_;
  RecordingStream* stream_;
  mutable std::vector<Answer> answers_;
};

// Gives a replayed kernel the recorded answers again, in order; asking for anything else is an
// error (the kernel took another path than when it was recorded).
class ReplayAllocator : public ir::OutputAllocator {
 public:
  explicit ReplayAllocator(const std::vector<Answer>& answers) : answers_(answers) {}
  absl::StatusOr<ir::Tensor> Allocate(const ir::Node& node, int, ir::DType, const std::vector<int64_t>&) override {
    ASSIGN_OR_RETURN(const Answer* a, Next(node, "an output"));
    if (!std::holds_alternative<ir::Tensor>(*a)) return Mismatch(node, "an output");
    return std::get<ir::Tensor>(*a);
  }
  bool SharesInputBuffer(const ir::Node& node, int) const override {
    absl::StatusOr<const Answer*> a = Next(node, "a view");
    return a.ok() && std::holds_alternative<bool>(**a) && std::get<bool>(**a);
  }
  absl::StatusOr<void*> Workspace(const ir::Node& node, int64_t) override {
    ASSIGN_OR_RETURN(const Answer* a, Next(node, "scratch"));
    if (!std::holds_alternative<void*>(*a)) return Mismatch(node, "scratch");
    return std::get<void*>(*a);
  }
  absl::Status Done(const ir::Node& node) const {
    if (next_ == answers_.size()) return absl::OkStatus();
    return Mismatch(node, "fewer buffers");
  }

 private:
  absl::StatusOr<const Answer*> Next(const ir::Node& node, const char* what) const {
    if (next_ >= answers_.size()) return Mismatch(node, what);
    return &answers_[next_++];
  }
  static absl::Status Mismatch(const ir::Node& node, const char* what) {
    return absl::InternalError("replaying " + ir::NodeLabel(node) + ": the kernel asked for " + what +
                               " where its recording did not");
  }
  const std::vector<Answer>& answers_;
  mutable size_t next_ = 0;
};

class RecordingBackend : public Backend {
 public:
  RecordingBackend(std::shared_ptr<const Backend> inner, std::set<ir::OpKind> not_capturable,
                   std::set<ir::OpKind> refused, std::set<ir::OpKind> failing)
      : inner_(std::move(inner)),
        not_capturable_(std::move(not_capturable)),
        refused_(std::move(refused)),
        failing_(std::move(failing)) {}

  std::string name() const override { return inner_->name(); }
  ir::Placement placement() const override { return inner_->placement(); }

  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(int64_t bytes) const override {
    if (recording_streams > 0) return FAILED_PRECONDITION() << "Allocate is not permitted while capturing a graph";
    return inner_->Allocate(bytes);
  }
  absl::Status Fill(const ir::Tensor& dst, uint8_t byte, Stream* s) const override {
    return Recorded(s, dst, [inner = inner_, d = Unowned(dst), byte, is = Inner(s)] { return inner->Fill(d, byte, is); });
  }
  absl::Status Copy(const ir::Tensor& src, const ir::Tensor& dst, Stream* s) const override {
    return Recorded(s, dst, [inner = inner_, a = Unowned(src), b = Unowned(dst), is = Inner(s)] {
      return inner->Copy(a, b, is);
    });
  }
  absl::Status FromHost(const ir::Tensor& host, const ir::Tensor& dst, Stream* s) const override {
    RETURN_IF_ERROR(Refuse(s, "FromHost"));
    return inner_->FromHost(host, dst, Inner(s));
  }
  absl::StatusOr<ir::Tensor> ToHost(const ir::Tensor& src, Stream* s) const override {
    RETURN_IF_ERROR(Refuse(s, "ToHost"));
    return inner_->ToHost(src, Inner(s));
  }
  absl::Status Accumulate(const ir::Tensor& acc, const ir::Tensor& x, Stream* s) const override {
    return Recorded(s, acc, [inner = inner_, a = Unowned(acc), b = Unowned(x), is = Inner(s)] {
      return inner->Accumulate(a, b, is);
    });
  }
  absl::StatusOr<bool> AllFinite(const ir::Tensor& t, Stream* s) const override {
    RETURN_IF_ERROR(Refuse(s, "AllFinite"));
    return inner_->AllFinite(t, Inner(s));
  }

  absl::StatusOr<std::vector<ir::Tensor>> Run(const ir::Node& node, const std::vector<ir::Tensor>& inputs,
                                              const ExecContext& ctx, ir::OutputAllocator* outputs) const override {
    ASSIGN_OR_RETURN(std::vector<std::vector<ir::Tensor>> out,
                     RunRecorded({&node}, {inputs}, ctx, outputs,
                                 [](const Backend& be, const std::vector<const ir::Node*>& nodes,
                                    const std::vector<std::vector<ir::Tensor>>& in, const ExecContext& c,
                                    ir::OutputAllocator* o) -> absl::StatusOr<std::vector<std::vector<ir::Tensor>>> {
                                   ASSIGN_OR_RETURN(std::vector<ir::Tensor> one, be.Run(*nodes[0], in[0], c, o));
                                   return std::vector<std::vector<ir::Tensor>>{std::move(one)};
                                 }));
    return std::move(out[0]);
  }
  absl::StatusOr<std::vector<std::vector<ir::Tensor>>> RunGroup(const std::vector<const ir::Node*>& nodes,
                                                                const std::vector<std::vector<ir::Tensor>>& inputs,
                                                                const ExecContext& ctx,
                                                                ir::OutputAllocator* outputs) const override {
    return RunRecorded(nodes, inputs, ctx, outputs,
                       [](const Backend& be, const std::vector<const ir::Node*>& n,
                          const std::vector<std::vector<ir::Tensor>>& in, const ExecContext& c,
                          ir::OutputAllocator* o) { return be.RunGroup(n, in, c, o); });
  }
  int64_t WorkspaceBytes(const ir::Graph& g, const ir::Node& node) const override {
    return inner_->WorkspaceBytes(g, node);
  }
  bool ReadsOnHost(const ir::Node& node, int index) const override { return inner_->ReadsOnHost(node, index); }
  bool Capturable(const ir::Node& node) const override { return !not_capturable_.count(node.op); }
  bool CanCapture() const override { return true; }
  std::unique_ptr<Stream> CreateStream() const override {
    return std::make_unique<RecordingStream>(inner_->CreateStream());
  }

 private:
  using RunFn = std::function<absl::StatusOr<std::vector<std::vector<ir::Tensor>>>(
      const Backend&, const std::vector<const ir::Node*>&, const std::vector<std::vector<ir::Tensor>>&,
      const ExecContext&, ir::OutputAllocator*)>;

  static RecordingStream* Recording(Stream* s) { return static_cast<RecordingStream*>(s); }
  static Stream* Inner(Stream* s) { return s != nullptr ? Recording(s)->inner() : nullptr; }
  static std::vector<Call>* Tape(Stream* s) { return s != nullptr ? Recording(s)->tape() : nullptr; }
  static absl::Status Refuse(Stream* s, const char* what) {
    return s != nullptr ? Recording(s)->Refuse(what) : absl::OkStatus();
  }
  // Runs `call`, which writes `dst`, now and, while `s` records, keeps it for the graph.
  static absl::Status Recorded(Stream* s, const ir::Tensor& dst, Call call) {
    std::vector<Call>* tape = Tape(s);
    if (tape != nullptr) Recording(s)->Save(dst.address(), dst.has_data() ? dst.num_bytes() : 0);
    const absl::Status st = call();
    if (tape == nullptr) return st;
    if (!st.ok()) {
      Recording(s)->Invalidate(std::string(st.message()));
      return st;
    }
    tape->push_back(std::move(call));
    return absl::OkStatus();
  }

  // `run` on the inner backend; while ctx's stream records, the kernels' buffers are logged and the
  // call is kept with them (its fills, issued by the allocator during the call, are on the tape
  // before it).
  absl::StatusOr<std::vector<std::vector<ir::Tensor>>> RunRecorded(const std::vector<const ir::Node*>& nodes,
                                                                   const std::vector<std::vector<ir::Tensor>>& inputs,
                                                                   const ExecContext& ctx,
                                                                   ir::OutputAllocator* outputs, RunFn run) const {
    ExecContext c = ctx;
    c.stream = Inner(ctx.stream);
    std::vector<Call>* tape = Tape(ctx.stream);
    if (tape == nullptr) return run(*inner_, nodes, inputs, c, outputs);
    RecordingStream* rs = Recording(ctx.stream);
    if (outputs == nullptr || refused_.count(nodes[0]->op)) {
      const std::string why = ir::NodeLabel(*nodes[0]) + (outputs == nullptr ? ": a kernel without planned outputs "
                                                                               "cannot be captured (it allocates)"
                                                                             : ": this kernel cannot be captured");
      rs->Invalidate(why);
      return FAILED_PRECONDITION() << why;
    }
    if (failing_.count(nodes[0]->op)) {  // a check of the kernel's own: the capture stays valid
      return FAILED_PRECONDITION() << ir::NodeLabel(*nodes[0]) << ": this kernel fails while capturing";
    }
    LoggingAllocator log(outputs, rs);
    absl::StatusOr<std::vector<std::vector<ir::Tensor>>> ran = run(*inner_, nodes, inputs, c, &log);
    if (!ran.ok()) rs->Invalidate(std::string(ran.status().message()));
    ASSIGN_OR_RETURN(std::vector<std::vector<ir::Tensor>> out, std::move(ran));
    std::vector<std::vector<ir::Tensor>> held(inputs.size());  // what a graph holds: addresses
    for (size_t i = 0; i < inputs.size(); ++i)
      for (const ir::Tensor& t : inputs[i]) held[i].push_back(Unowned(t));
    tape->push_back([inner = inner_, nodes, inputs = std::move(held), c, run,
                     answers = std::move(log).answers()]() -> absl::Status {
      ReplayAllocator replay(answers);
      RETURN_IF_ERROR(run(*inner, nodes, inputs, c, &replay).status());
      return replay.Done(*nodes[0]);
    });
    return out;
  }

  std::shared_ptr<const Backend> inner_;
  std::set<ir::OpKind> not_capturable_, refused_, failing_;
};

}  // namespace

std::shared_ptr<const Backend> MakeRecordingBackend(std::shared_ptr<const Backend> inner,
                                                    std::set<ir::OpKind> not_capturable,
                                                    std::set<ir::OpKind> refused,
                                                    std::set<ir::OpKind> failing) {
  return std::make_shared<RecordingBackend>(std::move(inner), std::move(not_capturable), std::move(refused),
                                            std::move(failing));
}

}  // namespace onnxpipe::backend
