// The file protocol of the emulator's harnesses (ops_emu.cpp, gemm_entry_emu.cpp), run as
// `<tool> <mode> <dir>`: dir holds meta.txt (whitespace-separated integers, the mode's sizes) and
// one raw little-endian array per input (NAME.bin); the harness writes its outputs to out.bin.
// Bad arguments or a missing file: a message and exit code 2.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

struct HarnessDir {
    std::string tool, mode, dir;
    std::vector<int64_t> meta;

    HarnessDir(const char * tool_name, int argc, char ** argv) : tool(tool_name) {
        if (argc != 3) {
            std::fprintf(stderr, "usage: %s <mode> <dir>\n", tool_name);
            std::exit(2);
        }
        mode = argv[1];
        dir = std::string(argv[2]) + "/";
        std::ifstream f(dir + "meta.txt");
        for (int64_t v; f >> v;) meta.push_back(v);
    }

    std::vector<char> in(const char * name) const {
        const std::string path = dir + name + ".bin";
        std::ifstream f(path, std::ios::binary);
        if (!f) {
            std::fprintf(stderr, "%s: cannot read %s\n", tool.c_str(), path.c_str());
            std::exit(2);
        }
        return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    }

    void write_out(const std::vector<char> & out) const {
        std::ofstream(dir + "out.bin", std::ios::binary).write(out.data(), (std::streamsize)out.size());
    }
};
