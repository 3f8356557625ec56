// One pass over the bytes with a small word buffer; no regex (std::regex is slow enough to dominate loading the
// 25k-review IMDB train split).
#include "executor/text/tokenizer.h"

namespace onnxpipe::text {
namespace {

// Whitespace and the other ASCII control characters (NUL, DEL, stray escapes) all separate tokens.
bool IsSpace(unsigned char c) { return c <= ' ' || c == 0x7f; }
bool IsPunct(unsigned char c) {
  return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
}
unsigned char Lower(unsigned char c) { return (c >= 'A' && c <= 'Z') ? static_cast<unsigned char>(c + 32) : c; }

// Length of an HTML line break starting at text[i] ("<br", spaces, optional "/", spaces, ">"), or 0.
size_t LineBreakLength(std::string_view text, size_t i) {
  if (text.size() - i < 4 || text[i] != '<' || Lower(text[i + 1]) != 'b' || Lower(text[i + 2]) != 'r') return 0;
  size_t j = i + 3;
  while (j < text.size() && text[j] == ' ') ++j;
  if (j < text.size() && text[j] == '/') ++j;
  while (j < text.size() && text[j] == ' ') ++j;
  if (j < text.size() && text[j] == '>') return j + 1 - i;
  return 0;
}

}  // namespace

void ForEachToken(std::string_view text, const std::function<void(std::string_view)>& fn) {
  std::string word;
  auto flush = [&] {
    if (!word.empty()) {
      fn(word);
      word.clear();
    }
  };
  for (size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c == '<') {
      if (size_t n = LineBreakLength(text, i)) {
        flush();
        i += n;
        continue;
      }
    }
    if (IsSpace(c)) {
      flush();
    } else if (IsPunct(c)) {
      flush();
      char p = static_cast<char>(c);
      fn(std::string_view(&p, 1));
    } else {
      word.push_back(static_cast<char>(Lower(c)));
    }
    ++i;
  }
  flush();
}

std::vector<std::string> Tokenize(std::string_view text) {
  std::vector<std::string> out;
  ForEachToken(text, [&](std::string_view t) { out.emplace_back(t); });
  return out;
}

}  // namespace onnxpipe::text
