// Resolves --data-format auto from what the path holds, so that the npy layout stays the default for folders of
// .npy files and a text corpus needs no flag either.
#include "tools/train_data.h"

#include <filesystem>

#include "executor/text/datasets.h"
#include "executor/train/text_data.h"
#include "executor/train/training_graph.h"
#include "frontend/ir/status.h"
#include "tools/model.h"

namespace onnxpipe::tools {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> DetectFormat(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    if (fs::path(path).extension() == ".tsv") return std::string("tsv");
    return std::string("aclimdb");  // an archive: libarchive says whether it can read it
  }
  if (!fs::is_directory(path, ec)) return NOT_FOUND() << "--data " << path << " does not exist";
  bool npy = false;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    if (e.path().extension() == ".npy") npy = true;
  }
  if (npy) return std::string("npy");
  if (fs::exists(fs::path(path) / "train.tsv")) return std::string("tsv");
  if (fs::is_directory(fs::path(path) / "train") || fs::is_directory(fs::path(path) / "aclImdb")) {
    return std::string("aclimdb");
  }
  return INVALID_ARGUMENT() << "--data " << path
                            << " holds no .npy files, no train.tsv and no train/ folder: say which layout it is "
                               "with --data-format npy|aclimdb|tsv";
}

absl::StatusOr<TrainData> LoadNpy(const ir::Graph& imported, const DataRequest& r,
                                  const std::vector<train::FieldSpec>& fields, TrainData out) {
  ASSIGN_OR_RETURN(out.train, train::Dataset::Load(r.path, fields, r.batch, &out.bindings));
  if (r.with_test) {
    const std::string test_dir = (fs::path(r.path) / "test").string();
    if (!fs::is_directory(test_dir)) {
      return NOT_FOUND() << "--eval with npy data reads the test split from " << test_dir
                         << " (the same <name>.npy files), which does not exist";
    }
    ASSIGN_OR_RETURN(train::Dataset test, train::Dataset::Load(test_dir, fields, /*batch=*/1, &out.bindings));
    out.test = std::move(test);
  }
  out.summary = std::to_string(out.train.rows()) + " training rows (npy)";
  return out;
}

absl::StatusOr<TrainData> LoadText(const ir::Graph& imported, const DataRequest& r,
                                   const std::vector<train::FieldSpec>& fields, TrainData out) {
  ASSIGN_OR_RETURN(train::TextInputs inputs, train::FindTextInputs(imported, r.labels));
  ASSIGN_OR_RETURN(train::MaskConvention mask, train::ParseMaskConvention(r.mask));
  int64_t seq = r.seq;
  if (inputs.seq && seq > 0 && seq != *inputs.seq) {
    return INVALID_ARGUMENT() << "--seq " << seq << " differs from the model's fixed sequence length "
                              << *inputs.seq << " (input '" << inputs.tokens << "')";
  }
  if (seq == 0) {
    if (!inputs.seq) {
      return INVALID_ARGUMENT() << "the model's sequence length is not fixed (input '" << inputs.tokens
                                << "' dim 1 is '" << inputs.seq_symbol << "'): pass --seq S to pad/truncate "
                                << "the texts to S tokens";
    }
    seq = *inputs.seq;
  }
  if (!inputs.seq_symbol.empty()) out.bindings[inputs.seq_symbol] = seq;

  ASSIGN_OR_RETURN(text::TextFormat format, text::ParseTextFormat(out.format));
  ASSIGN_OR_RETURN(text::TextDataset texts, text::LoadTextDataset(format, r.path));
  if (texts.train.size() == 0) return INVALID_ARGUMENT() << "--data " << r.path << " has no training examples";
  if (r.with_test && texts.test.size() == 0) {
    return INVALID_ARGUMENT() << "--eval needs a test split, but --data " << r.path
                              << " has none (a TSV folder needs test.tsv beside train.tsv)";
  }
  if (r.vocab_size > inputs.embedding_rows) {
    return INVALID_ARGUMENT() << "--vocab-size " << r.vocab_size << " exceeds the rows of the model's embedding "
                              << "table '" << inputs.embedding << "' (" << inputs.embedding_rows << ")";
  }
  if (!r.vocab_file.empty()) {
    ASSIGN_OR_RETURN(text::Vocabulary v, text::Vocabulary::Load(r.vocab_file));
    if (v.size() > inputs.embedding_rows) {
      return INVALID_ARGUMENT() << "vocabulary " << r.vocab_file << " has " << v.size() << " tokens, more than "
                                << "the rows of the model's embedding table '" << inputs.embedding << "' ("
                                << inputs.embedding_rows << ")";
    }
    out.vocab = std::move(v);
  } else {
    const int64_t size = r.vocab_size > 0 ? r.vocab_size : inputs.embedding_rows;
    ASSIGN_OR_RETURN(text::Vocabulary v, text::Vocabulary::Build(texts.train.texts, size));
    out.vocab = std::move(v);
  }
  std::map<std::string, ir::Tensor> train =
      train::EncodeTextSplit(texts.train, *out.vocab, seq, inputs, mask, r.labels);
  ASSIGN_OR_RETURN(out.train, train::Dataset::FromTensors(std::move(train), fields, r.batch, &out.bindings));
  if (r.with_test) {
    std::map<std::string, ir::Tensor> test =
        train::EncodeTextSplit(texts.test, *out.vocab, seq, inputs, mask, r.labels);
    ASSIGN_OR_RETURN(train::Dataset d, train::Dataset::FromTensors(std::move(test), fields, 1, &out.bindings));
    out.test = std::move(d);
  }
  out.summary = std::to_string(texts.train.size()) + " training and " + std::to_string(texts.test.size()) +
                " test texts (" + out.format + "), " + std::to_string(texts.num_classes) + " classes, vocabulary " +
                std::to_string(out.vocab->size()) + ", seq " + std::to_string(seq) + " -> '" + inputs.tokens + "'" +
                (inputs.mask.empty() ? "" : ", mask -> '" + inputs.mask + "'");
  return out;
}

}  // namespace

std::string VocabPathBeside(const std::string& model_path) {
  fs::path p(model_path);
  if (p.extension() == ".onnx") p.replace_extension();
  return p.string() + ".vocab.txt";
}

absl::StatusOr<TrainData> LoadTrainData(const ir::Graph& imported, const DataRequest& r) {
  TrainData out;
  if (r.format == "auto") {
    ASSIGN_OR_RETURN(out.format, DetectFormat(r.path));
  } else if (r.format == "npy" || r.format == "aclimdb" || r.format == "tsv") {
    out.format = r.format;
  } else {
    return INVALID_ARGUMENT() << "--data-format expects npy, aclimdb or tsv, got '" << r.format << "'";
  }
  ASSIGN_OR_RETURN(std::vector<train::FieldSpec> fields, train::DataFields(imported, r.logits, r.labels));
  if (out.format == "npy") {
    if (r.seq > 0) {
      for (const std::string& s : ClassifySymbols(imported).seq) out.bindings[s] = r.seq;
    }
    return LoadNpy(imported, r, fields, std::move(out));
  }
  return LoadText(imported, r, fields, std::move(out));
}

}  // namespace onnxpipe::tools
