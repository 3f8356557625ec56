// The data of `onnxpipe train`: the --data folder (or archive, or .tsv file) in one of the --data-format layouts,
// turned into train (and, for --eval, test) Datasets that match the model's inputs.
//   npy      DIR/<input>.npy per graph input + DIR/<labels>.npy (executor/train/dataset.h); --eval reads the test
//            split from DIR/test/ in the same layout
//   aclimdb  the IMDB review layout, folder or archive (executor/text/datasets.h)
//   tsv      DIR/train.tsv + DIR/test.tsv, or one .tsv file (train only)
// Text is tokenized (executor/text/tokenizer.h), mapped through a vocabulary built from the train split (or
// loaded: resume) and padded/truncated to the sequence length, and fed to the inputs executor/train/text_data.h
// finds.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "executor/text/vocabulary.h"
#include "executor/train/dataset.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::tools {

struct DataRequest {
  std::string path;
  std::string format = "auto";  // auto | npy | aclimdb | tsv
  int64_t batch = 0;
  int64_t seq = 0;              // 0: from the data (npy) or the model's fixed length (text)
  int64_t vocab_size = 0;       // 0: the model's embedding rows (text)
  std::string mask = "auto";    // mask convention (text)
  std::string vocab_file;       // load this vocabulary instead of building one (resume)
  bool with_test = false;       // --eval
  std::string logits, labels;
};

struct TrainData {
  std::string format;  // the resolved format
  train::Dataset train;
  std::optional<train::Dataset> test;
  std::optional<text::Vocabulary> vocab;  // text formats
  std::map<std::string, int64_t> bindings;  // symbols the data binds (sequence length, ...)
  std::string summary;                      // one line for the user: rows, classes, vocabulary, seq
};

// `imported`: the model as imported (symbols unbound).
absl::StatusOr<TrainData> LoadTrainData(const ir::Graph& imported, const DataRequest& request);

// Where --save OUT.onnx keeps its vocabulary: OUT.vocab.txt (OUT without the .onnx extension).
std::string VocabPathBeside(const std::string& model_path);

}  // namespace onnxpipe::tools
