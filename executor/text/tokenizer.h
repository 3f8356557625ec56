// A basic English tokenizer for review-style text (aclImdb, TSV corpora):
//   1. HTML line breaks `<br />` (any case, `<br>`, `<br/>`, `<br  />`) are removed (they separate tokens);
//   2. ASCII letters are lower-cased;
//   3. text is split on ASCII whitespace (and other ASCII control characters);
//   4. every ASCII punctuation character (!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~) is a token of its own.
// Bytes >= 0x80 (UTF-8 multi-byte characters) are word characters and are kept as they are (no Unicode case
// folding). Example: "Don't STOP!! <br /><br />It's 10/10." ->
//   don ' t stop ! ! it ' s 10 / 10 .
// Because '<' and '>' are punctuation, a token can never be "<pad>" or "<unk>".
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace onnxpipe::text {

// Calls `fn` with each token in order; the view is valid only during the call.
void ForEachToken(std::string_view text, const std::function<void(std::string_view)>& fn);

std::vector<std::string> Tokenize(std::string_view text);

}  // namespace onnxpipe::text
