// A small generated two-class corpus for the text-training CLI tests, written in the aclImdb layout and as TSV
// with the same example order (per split: neg files by name, then pos files by name), so that both layouts feed
// the trainer the very same rows. Texts are lower-case words separated by single spaces: their tokens are the
// words, which lets tests encode them independently of the tokenizer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace onnxpipe::testing {

struct TextExample {
  int label;
  std::string text;
};

// `n` examples per class and split; lengths 3..20 words (some shorter and some longer than typical --seq values).
inline std::vector<TextExample> MakeTextSplit(int n, uint64_t seed) {
  const std::vector<std::string> neg = {"soup", "bread", "cheese", "apple", "salad", "wine", "spoon", "oven"};
  const std::vector<std::string> pos = {"kernel", "disk", "cpu", "byte", "compiler", "bug", "unix", "cache"};
  const std::vector<std::string> both = {"the", "a", "is", "of", "and", "very", "my", "old"};
  uint64_t s = seed * 2654435761u + 12345;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  };
  std::vector<TextExample> out;
  for (int label = 0; label < 2; ++label) {
    for (int i = 0; i < n; ++i) {
      const int words = 3 + next() % 18;
      std::string t;
      for (int w = 0; w < words; ++w) {
        const std::vector<std::string>& pool = next() % 3 == 0 ? both : (label ? pos : neg);
        t += (w ? " " : "") + pool[next() % pool.size()];
      }
      out.push_back({label, t});
    }
  }
  return out;
}

// ROOT/{train,test}/{neg,pos}/<id>_<rating>.txt and ROOT/{train,test}.tsv. File ids are zero-padded so that name
// order is index order.
inline void WriteTextCorpus(const std::filesystem::path& root, const std::vector<TextExample>& train,
                            const std::vector<TextExample>& test) {
  namespace fs = std::filesystem;
  fs::create_directories(root);
  for (const auto& [split, examples] : {std::pair{"train", &train}, std::pair{"test", &test}}) {
    std::ofstream tsv(root / (std::string(split) + ".tsv"));
    for (size_t i = 0; i < examples->size(); ++i) {
      const TextExample& e = (*examples)[i];
      const fs::path dir = root / split / (e.label ? "pos" : "neg");
      fs::create_directories(dir);
      char name[32];
      std::snprintf(name, sizeof(name), "%05zu_%d.txt", i, e.label ? 8 : 2);
      std::ofstream(dir / name) << e.text;
      tsv << e.label << "\t" << e.text << "\n";
    }
  }
}

}  // namespace onnxpipe::testing
