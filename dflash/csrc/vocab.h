// Tokenizer and chat template from the GGUF, through the vendored libllama's vocabulary
// code, so that tokenization is identical to llama.cpp's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct llama_model;
struct llama_vocab;

namespace dflash {

class Vocab {
  public:
    explicit Vocab(const std::string & path);
    ~Vocab();
    Vocab(const Vocab &) = delete;
    Vocab & operator=(const Vocab &) = delete;

    std::vector<int32_t> tokenize(const std::string & text, bool add_special, bool parse_special) const;
    std::string detokenize(const std::vector<int32_t> & tokens, bool remove_special, bool unparse_special) const;
    std::string token_to_piece(int32_t token, bool special) const;
    int32_t n_tokens() const;
    int32_t bos() const;
    int32_t eos() const;
    int32_t eot() const;
    bool add_bos() const;
    bool is_eog(int32_t token) const;
    std::vector<int32_t> eog_tokens() const;
    std::string chat_template() const;
    std::string meta(const std::string & key) const;

  private:
    llama_model * model_ = nullptr;
    const llama_vocab * vocab_ = nullptr;
};

// Route libllama/ggml logs: quiet unless verbose; the last error line is kept for messages.
void set_log_verbosity(bool verbose);
void reset_log_errors();
std::string last_log_error();

}  // namespace dflash
