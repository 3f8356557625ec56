// The pieces of a stage program file (stage_file.h) as JSON and back: dims, tensors, node attributes, the training
// options and the program facts. Readers throw nlohmann::json exceptions on a wrong type or a missing key and
// absl errors on a wrong value; stage_file_read.cc turns both into an error naming the file.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "executor/pipeline/executor.h"
#include "frontend/autodiff/training_graph.h"
#include "frontend/ir/attrs.h"
#include "frontend/ir/shape.h"
#include "frontend/ir/tensor.h"
#include "nlohmann/json.hpp"

namespace onnxpipe::pipeline {

// A concrete dim as its value; a symbolic one as {factor, symbols}.
nlohmann::json DimJson(const ir::Dim& d);
ir::Dim DimFromJson(const nlohmann::json& j);

// {dtype, dims, data (CBOR bytes)}; an all-zero tensor {dtype, dims, zeros: true}; a dims-only one without data.
nlohmann::json TensorJson(const ir::Tensor& t);
absl::StatusOr<ir::Tensor> TensorFromJson(const nlohmann::json& j);

// {name: {kind: value}}, kind one of i, f, s, ints, floats, t.
nlohmann::json AttrsJson(const ir::Attrs& a);
absl::StatusOr<ir::Attrs> AttrsFromJson(const nlohmann::json& j);

nlohmann::json SpecJson(const autodiff::TrainingGraphSpec& s);
absl::StatusOr<autodiff::TrainingGraphSpec> SpecFromJson(const nlohmann::json& j);
// The fields of `a` and `b` that differ, each as "flag: a vs b" with the `onnxpipe train` flag that sets it.
std::vector<std::string> SpecDifferences(const autodiff::TrainingGraphSpec& a, const autodiff::TrainingGraphSpec& b);

nlohmann::json FactsJson(const ProgramFacts& f);
absl::StatusOr<ProgramFacts> FactsFromJson(const nlohmann::json& j);

}  // namespace onnxpipe::pipeline
