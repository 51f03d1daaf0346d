// A validated, read-only view of a GGUF file's metadata and tensor table.
// Opening checks what ggml would otherwise assert on later: the header parses, every
// tensor has a known type and lies inside the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct gguf_context;
struct ggml_context;
struct ggml_tensor;

namespace dflash {

class GgufFile {
  public:
    explicit GgufFile(const std::string & path);
    ~GgufFile();
    GgufFile(const GgufFile &) = delete;
    GgufFile & operator=(const GgufFile &) = delete;

    const std::string & path() const { return path_; }
    std::string arch() const { return get_str("general.architecture", ""); }

    bool has(const std::string & key) const;
    std::string get_str(const std::string & key, const std::string & def) const;
    // Integer keys of any integer width; throws ModelLoadError when required and missing.
    int64_t get_int(const std::string & key, bool required, int64_t def = 0) const;
    double get_float(const std::string & key, bool required, double def = 0.0) const;
    // Integer/bool arrays; empty when missing.
    std::vector<int64_t> get_int_array(const std::string & key) const;
    // String arrays; empty when missing or of another type.
    std::vector<std::string> get_str_array(const std::string & key) const;
    // A key that is either a scalar or a per-layer array, expanded to n values.
    std::vector<int64_t> get_int_or_array(const std::string & key, size_t n, bool required, int64_t def = 0) const;

    // Tensor metadata (no data); nullptr when absent.
    ggml_tensor * tensor(const std::string & name) const;
    size_t tensor_file_offset(const std::string & name) const;
    ggml_context * meta() const { return meta_; }

  private:
    int64_t key_id(const std::string & key) const;
    std::string path_;
    gguf_context * gguf_ = nullptr;
    ggml_context * meta_ = nullptr;
};

}  // namespace dflash
