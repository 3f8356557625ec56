// onnxpipe: the command-line tool. Subcommands are registered in tools/commands.h.
#include <cstdio>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  std::printf("onnxpipe\n");
  return 0;
}
