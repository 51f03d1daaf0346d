#include "target_cache.h"

#include "errors.h"
#include "ggml-alloc.h"

namespace dflash {

TargetCache::TargetCache(const Qwen35Hparams & hp, const TargetCacheConfig & c) : cfg(c) {
    ggml_init_params p = {ggml_tensor_overhead() * (size_t)(12 * hp.n_layer + 8), nullptr, true};
    ctx_ = ggml_init(p);
    const int64_t kv_row = hp.head_dim * hp.n_head_kv;
    k.assign(hp.n_layer, nullptr);
    v.assign(hp.n_layer, nullptr);
    conv.assign(hp.n_layer, nullptr);
    ssm.assign(hp.n_layer, nullptr);
    attn_slot.assign(hp.n_layer, -1);
    gdn_slot.assign(hp.n_layer, -1);
    const int64_t nv = cfg.n_verify_max;
    S_ = hp.ssm_d_state, Hk_ = hp.ssm_n_k_heads, Hv_ = hp.ssm_n_v_heads, C_ = hp.conv_channels();
    int n_attn = 0, n_gdn = 0;
    for (int il = 0; il < hp.n_layer; ++il) {
        if (hp.is_recurrent[il]) {
            gdn_slot[il] = n_gdn++;
        } else {
            attn_slot[il] = n_attn++;
        }
    }
    if (n_attn > 0) {
        k_all = ggml_new_tensor_3d(ctx_, cfg.k_type, kv_row, cfg.n_ctx, n_attn);
        v_all = ggml_new_tensor_3d(ctx_, cfg.v_type, kv_row, cfg.n_ctx, n_attn);
        kv_tensors_ = {k_all, v_all};
    }
    const int64_t conv_n = (hp.ssm_d_conv - 1) * C_, ssm_n = S_ * S_ * Hv_;
    if (n_gdn > 0) {
        conv_all = ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, conv_n, n_gdn);
        ssm_all = ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, ssm_n, n_gdn);
        vin = ggml_new_tensor_3d(ctx_, GGML_TYPE_F32, 2 * S_ * Hk_ + S_ * Hv_ + C_, nv, n_gdn);
        vgate = ggml_new_tensor_3d(ctx_, GGML_TYPE_F32, Hv_, nv, n_gdn);
        vbeta = ggml_new_tensor_3d(ctx_, GGML_TYPE_F32, Hv_, nv, n_gdn);
        rs_tensors_ = {conv_all, ssm_all, vin, vgate, vbeta};
    }
    for (int il = 0; il < hp.n_layer; ++il) {
        if (attn_slot[il] >= 0) {
            const int64_t s = attn_slot[il];
            k[il] = ggml_view_2d(ctx_, k_all, kv_row, cfg.n_ctx, k_all->nb[1], s * k_all->nb[2]);
            v[il] = ggml_view_2d(ctx_, v_all, kv_row, cfg.n_ctx, v_all->nb[1], s * v_all->nb[2]);
            views_.insert(views_.end(), {k[il], v[il]});
        } else {
            const int64_t s = gdn_slot[il];
            conv[il] = ggml_view_2d(ctx_, conv_all, hp.ssm_d_conv - 1, C_, sizeof(float) * (hp.ssm_d_conv - 1),
                                    s * conv_all->nb[1]);
            ssm[il] = ggml_view_3d(ctx_, ssm_all, S_, S_, Hv_, sizeof(float) * S_, sizeof(float) * S_ * S_,
                                   s * ssm_all->nb[1]);
            views_.insert(views_.end(), {conv[il], ssm[il]});
        }
    }
}

ggml_tensor * TargetCache::ssm_dst(ggml_context * ctx, int il) const {
    const int64_t n = il < 0 ? ssm_all->ne[1] : 1;
    return ggml_view_2d(ctx, ssm_all, ssm_all->ne[0], n, ssm_all->nb[1], il < 0 ? 0 : gdn_slot[il] * ssm_all->nb[1]);
}

TargetCache::VerifyViews TargetCache::verify_views(ggml_context * ctx, int il, int64_t rows, ggml_tensor * in,
                                                   ggml_tensor * gate, ggml_tensor * beta) const {
    const int64_t slot = gdn_slot[il];
    const size_t es = sizeof(float), row = in->nb[1];
    const size_t base = slot * in->nb[2];
    auto heads = [&](int64_t h, size_t off) {  // [S, h, rows], rows apart
        return ggml_view_3d(ctx, in, S_, h, rows, es * S_, row, base + off);
    };
    auto scalars = [&](ggml_tensor * t) {  // [1, H_v, rows], contiguous
        return ggml_view_3d(ctx, t, 1, Hv_, rows, es, es * Hv_, slot * t->nb[2]);
    };
    VerifyViews r;
    r.q = heads(Hk_, 0);
    r.k = heads(Hk_, es * S_ * Hk_);
    r.v = heads(Hv_, es * 2 * S_ * Hk_);
    r.qkv = ggml_view_2d(ctx, in, C_, rows, row, base);
    r.x = ggml_view_2d(ctx, in, C_, rows, row, base + es * (2 * S_ * Hk_ + S_ * Hv_));
    r.g = scalars(gate);
    r.b = scalars(beta);
    return r;
}

TargetCache::~TargetCache() {
    if (kv_buf_) ggml_backend_buffer_free(kv_buf_);
    if (rs_buf_) ggml_backend_buffer_free(rs_buf_);
    if (ctx_) ggml_free(ctx_);
}

static size_t sum_bytes(ggml_backend_buffer_type_t buft, const std::vector<ggml_tensor *> & ts) {
    size_t n = 0;
    const size_t align = ggml_backend_buft_get_alignment(buft);
    for (auto * t : ts) n += GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), align);
    return n;
}

std::pair<size_t, size_t> TargetCache::bytes(ggml_backend_buffer_type_t buft) const {
    return {sum_bytes(buft, kv_tensors_), sum_bytes(buft, rs_tensors_)};
}

static ggml_backend_buffer_t alloc_list(ggml_backend_buffer_type_t buft, const std::vector<ggml_tensor *> & ts,
                                        const char * what) {
    if (ts.empty()) return nullptr;
    const size_t total = sum_bytes(buft, ts);
    ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(buft, total);
    if (!buf)
        throw EngineError(std::string("could not allocate ") + std::to_string(total >> 20) + " MiB for the " + what);
    ggml_tallocr ta = ggml_tallocr_new(buf);
    for (auto * t : ts) ggml_tallocr_alloc(&ta, t);
    return buf;
}

void TargetCache::allocate(ggml_backend_buffer_type_t buft) {
    kv_buf_ = alloc_list(buft, kv_tensors_, "KV cache");
    rs_buf_ = alloc_list(buft, rs_tensors_, "recurrent state");
    for (auto * t : views_) ggml_backend_view_init(t);
    // Masked rows still get multiplied by 0 in attention, so they must never hold NaN garbage.
    if (kv_buf_) ggml_backend_buffer_clear(kv_buf_, 0);
    clear();
}

void TargetCache::clear() {
    // Attention rows past n_past are masked (and finite), so only the recurrent state needs zeroing.
    if (rs_buf_) ggml_backend_buffer_clear(rs_buf_, 0);
    n_past = 0;
}

}  // namespace dflash
