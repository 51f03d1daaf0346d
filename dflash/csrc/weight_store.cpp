#include "weight_store.h"

#include "errors.h"
#include "ggml-alloc.h"
#include "ggml.h"
#include "gguf_file.h"

#include <algorithm>
#include <cstdio>
#include <memory>

namespace dflash {

WeightStore::~WeightStore() {
    for (auto * b : bufs_) ggml_backend_buffer_free(b);
    if (ctx_) ggml_free(ctx_);
}

ggml_tensor * WeightStore::add(const ggml_tensor * src, const std::string & name) {
    if (!ctx_) {
        // Metadata only; generous: a model has at most a few thousand weights.
        ggml_init_params p = {ggml_tensor_overhead() * 8192, nullptr, true};
        ctx_ = ggml_init(p);
    }
    if (tensors_.size() + n_stacked_ >= 8192) throw ModelLoadError("too many weight tensors");
    ggml_tensor * t = ggml_dup_tensor(ctx_, src);
    ggml_set_name(t, name.c_str());
    tensors_.emplace_back(t, name);
    return t;
}

void WeightStore::assign_buffers(const Backends & b,
                                 const std::function<bool(const ggml_tensor *, const std::string &)> & matmul_weight) {
    std::vector<ggml_backend_buffer_type_t> extra;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(b.main_dev);
    auto get_extra = reg ? (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
                               reg, "ggml_backend_dev_get_extra_bufts")
                         : nullptr;
    if (get_extra) {
        for (auto ** p = get_extra(b.main_dev); p && *p; ++p) extra.push_back(*p);
    }
    // Probe: would the device run this weight's matmul (one activation column) from that type?
    ggml_init_params ip = {ggml_tensor_overhead() * 8, nullptr, true};
    ggml_context * probe = ggml_init(ip);
    default_buft_ = b.main_buft;
    buft_of_.assign(tensors_.size(), b.main_buft);
    for (size_t i = 0; i < tensors_.size(); ++i) {
        ggml_tensor * w = tensors_[i].first;
        if (ggml_n_dims(w) != 2 || !matmul_weight(w, tensors_[i].second)) continue;
        for (auto * buft : extra) {
            ggml_tensor * x = ggml_new_tensor_2d(probe, GGML_TYPE_F32, w->ne[0], 1);
            ggml_tensor * op = ggml_mul_mat(probe, w, x);
            ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(buft, 0);
            ggml_backend_buffer_t saved = w->buffer;
            w->buffer = dummy;
            const bool ok = ggml_backend_dev_supports_op(b.main_dev, op);
            w->buffer = saved;
            ggml_backend_buffer_free(dummy);
            ggml_reset(probe);
            if (ok) {
                buft_of_[i] = buft;
                break;
            }
        }
    }
    ggml_free(probe);
}

std::vector<std::string> WeightStore::names() const {
    std::vector<std::string> out;
    for (auto & t : tensors_) out.push_back(t.second);
    return out;
}

size_t WeightStore::bytes() const {
    size_t total = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
        total += GGML_PAD(ggml_backend_buft_get_alloc_size(buft_of_[i], tensors_[i].first),
                          ggml_backend_buft_get_alignment(buft_of_[i]));
    }
    return total;
}

void WeightStore::load(const GgufFile & f, const ProgressFn & progress, const std::string & what) {
    // One buffer per buffer type, tensors placed with a linear allocator.
    std::vector<ggml_backend_buffer_type_t> types;
    for (auto * bt : buft_of_) {
        if (std::find(types.begin(), types.end(), bt) == types.end()) types.push_back(bt);
    }
    for (auto * bt : types) {
        size_t size = 0;
        const size_t align = ggml_backend_buft_get_alignment(bt);
        for (size_t i = 0; i < tensors_.size(); ++i) {
            if (buft_of_[i] == bt) size += GGML_PAD(ggml_backend_buft_get_alloc_size(bt, tensors_[i].first), align);
        }
        ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(bt, size);
        if (!buf) throw ModelLoadError("could not allocate " + std::to_string(size >> 20) + " MiB for the " + what);
        ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        bufs_.push_back(buf);
        ggml_tallocr ta = ggml_tallocr_new(buf);
        for (size_t i = 0; i < tensors_.size(); ++i) {
            if (buft_of_[i] == bt) ggml_tallocr_alloc(&ta, tensors_[i].first);
        }
    }

    std::unique_ptr<FILE, int (*)(FILE *)> fp(fopen(f.path().c_str(), "rb"), fclose);
    if (!fp) throw ModelLoadError("cannot open " + f.path());
    size_t total = 0, done = 0;
    for (auto & [t, n] : tensors_) total += ggml_nbytes(t);
    std::vector<uint8_t> staging;
    for (auto & [t, n] : tensors_) {
        // Whole tensors through tensor_set: device copies and CPU repacking both need that.
        const size_t nbytes = ggml_nbytes(t);
        if (fseeko(fp.get(), (off_t)f.tensor_file_offset(n), SEEK_SET) != 0) {
            throw ModelLoadError("seek failed in " + f.path());
        }
        staging.resize(nbytes);
        if (fread(staging.data(), 1, nbytes, fp.get()) != nbytes) {
            throw ModelLoadError("read failed (truncated?) in " + f.path());
        }
        ggml_backend_tensor_set(t, staging.data(), 0, nbytes);
        done += nbytes;
        if (progress) progress(done, total);
    }
}

ggml_tensor * WeightStore::stacked(const std::vector<ggml_tensor *> & parts, const std::string & name) {
    // the metadata context holds 8192 tensors: the file's weights and these views together
    if (parts.size() < 2 || !ctx_ || tensors_.size() + n_stacked_ >= 8192) return nullptr;
    const ggml_tensor * first = parts[0];
    int64_t rows = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
        const ggml_tensor * t = parts[i];
        if (!t || !t->buffer || t->view_src || ggml_n_dims(t) != 2 || t->type != first->type ||
            t->ne[0] != first->ne[0] || t->nb[1] != first->nb[1] || t->buffer != first->buffer ||
            ggml_backend_buffer_get_type(t->buffer) != default_buft_ ||
            (i > 0 && (const char *)t->data != (const char *)parts[i - 1]->data + ggml_nbytes(parts[i - 1]))) {
            return nullptr;
        }
        rows += t->ne[1];
    }
    ggml_tensor * w = ggml_new_tensor_2d(ctx_, first->type, first->ne[0], rows);
    ++n_stacked_;
    w->buffer = first->buffer;
    w->data = first->data;
    ggml_set_name(w, name.c_str());
    return w;
}

}  // namespace dflash
