// Where one process sits in a multi-process run: K pipeline stages times D data-parallel replicas,
// one rank each (world = K x D). World rank r runs stage r % K of replica r / K, so the K stages of
// a replica are consecutive ranks (neighbours on one node when a node holds a whole pipeline, where
// the point-to-point traffic is heaviest) and a stage's D replicas are K apart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace onnxpipe::pipeline {

struct Topology {
  int32_t stages = 1;    // K
  int32_t replicas = 1;  // D
  int32_t rank = 0;      // this process's world rank

  int32_t world() const { return stages * replicas; }
  int32_t stage() const { return rank % stages; }
  int32_t replica() const { return rank / stages; }
  int32_t RankOf(int32_t stage, int32_t replica) const { return replica * stages + stage; }
  // The world ranks of this replica's stages, by stage.
  std::vector<int> PipelineGroup() const {
    std::vector<int> g;
    for (int32_t s = 0; s < stages; ++s) g.push_back(RankOf(s, replica()));
    return g;
  }
  // The world ranks holding this rank's stage, by replica (the gradient all-reduce's order).
  std::vector<int> DataParallelGroup() const {
    std::vector<int> g;
    for (int32_t d = 0; d < replicas; ++d) g.push_back(RankOf(stage(), d));
    return g;
  }
  std::string Describe() const {
    return "rank " + std::to_string(rank) + " of " + std::to_string(world()) + " (stage " + std::to_string(stage()) +
           " of " + std::to_string(stages) + ", replica " + std::to_string(replica()) + " of " +
           std::to_string(replicas) + ")";
  }
};

}  // namespace onnxpipe::pipeline
