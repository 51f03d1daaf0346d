#include "gguf_file.h"

#include "errors.h"
#include "ggml.h"
#include "gguf.h"

#include <sys/stat.h>

namespace dflash {

GgufFile::GgufFile(const std::string & path) : path_(path) {
    struct stat st{};
    if (stat(path.c_str(), &st) != 0) {
        throw ModelLoadError("model file not found: " + path);
    }
    if (!S_ISREG(st.st_mode)) {
        throw ModelLoadError("model path is not a regular file: " + path);
    }
    gguf_init_params params = {/*no_alloc =*/true, /*ctx =*/&meta_};
    gguf_ = gguf_init_from_file(path.c_str(), params);
    if (!gguf_ || !meta_) {
        throw ModelLoadError("not a valid GGUF file (corrupt or truncated header): " + path);
    }
    // gguf checks the header; the data section may still be cut short.
    const size_t data_off = gguf_get_data_offset(gguf_);
    const int64_t n = gguf_get_n_tensors(gguf_);
    for (int64_t i = 0; i < n; ++i) {
        const char * name = gguf_get_tensor_name(gguf_, i);
        ggml_tensor * t = ggml_get_tensor(meta_, name);
        const size_t end = data_off + gguf_get_tensor_offset(gguf_, i) + ggml_nbytes(t);
        if (end > (size_t)st.st_size) {
            throw ModelLoadError("truncated GGUF file: tensor '" + std::string(name) + "' ends at byte " +
                                 std::to_string(end) + " but the file has " + std::to_string(st.st_size) +
                                 " bytes: " + path);
        }
    }
}

GgufFile::~GgufFile() {
    if (gguf_) gguf_free(gguf_);
    if (meta_) ggml_free(meta_);
}

int64_t GgufFile::key_id(const std::string & key) const { return gguf_find_key(gguf_, key.c_str()); }

bool GgufFile::has(const std::string & key) const { return key_id(key) >= 0; }

std::string GgufFile::get_str(const std::string & key, const std::string & def) const {
    const int64_t id = key_id(key);
    if (id < 0 || gguf_get_kv_type(gguf_, id) != GGUF_TYPE_STRING) return def;
    return gguf_get_val_str(gguf_, id);
}

static bool scalar_int(const gguf_context * g, int64_t id, int64_t & out) {
    switch (gguf_get_kv_type(g, id)) {
        case GGUF_TYPE_UINT8:
            out = gguf_get_val_u8(g, id);
            return true;
        case GGUF_TYPE_INT8:
            out = gguf_get_val_i8(g, id);
            return true;
        case GGUF_TYPE_UINT16:
            out = gguf_get_val_u16(g, id);
            return true;
        case GGUF_TYPE_INT16:
            out = gguf_get_val_i16(g, id);
            return true;
        case GGUF_TYPE_UINT32:
            out = gguf_get_val_u32(g, id);
            return true;
        case GGUF_TYPE_INT32:
            out = gguf_get_val_i32(g, id);
            return true;
        case GGUF_TYPE_UINT64:
            out = (int64_t)gguf_get_val_u64(g, id);
            return true;
        case GGUF_TYPE_INT64:
            out = gguf_get_val_i64(g, id);
            return true;
        case GGUF_TYPE_BOOL:
            out = gguf_get_val_bool(g, id);
            return true;
        default:
            return false;
    }
}

int64_t GgufFile::get_int(const std::string & key, bool required, int64_t def) const {
    const int64_t id = key_id(key);
    int64_t v = def;
    if (id < 0) {
        if (required) throw ModelLoadError("GGUF key '" + key + "' is missing in " + path_);
        return def;
    }
    if (!scalar_int(gguf_, id, v)) throw ModelLoadError("GGUF key '" + key + "' is not an integer in " + path_);
    return v;
}

double GgufFile::get_float(const std::string & key, bool required, double def) const {
    const int64_t id = key_id(key);
    if (id < 0) {
        if (required) throw ModelLoadError("GGUF key '" + key + "' is missing in " + path_);
        return def;
    }
    switch (gguf_get_kv_type(gguf_, id)) {
        case GGUF_TYPE_FLOAT32:
            return gguf_get_val_f32(gguf_, id);
        case GGUF_TYPE_FLOAT64:
            return gguf_get_val_f64(gguf_, id);
        default: {
            int64_t v;
            if (scalar_int(gguf_, id, v)) return (double)v;
            throw ModelLoadError("GGUF key '" + key + "' is not a number in " + path_);
        }
    }
}

std::vector<int64_t> GgufFile::get_int_array(const std::string & key) const {
    std::vector<int64_t> out;
    const int64_t id = key_id(key);
    if (id < 0 || gguf_get_kv_type(gguf_, id) != GGUF_TYPE_ARRAY) return out;
    const size_t n = gguf_get_arr_n(gguf_, id);
    const void * data = gguf_get_arr_data(gguf_, id);
    switch (gguf_get_arr_type(gguf_, id)) {
        case GGUF_TYPE_INT32:
            for (size_t i = 0; i < n; ++i) out.push_back(((const int32_t *)data)[i]);
            break;
        case GGUF_TYPE_UINT32:
            for (size_t i = 0; i < n; ++i) out.push_back(((const uint32_t *)data)[i]);
            break;
        case GGUF_TYPE_INT64:
            for (size_t i = 0; i < n; ++i) out.push_back(((const int64_t *)data)[i]);
            break;
        case GGUF_TYPE_UINT64:
            for (size_t i = 0; i < n; ++i) out.push_back((int64_t)((const uint64_t *)data)[i]);
            break;
        case GGUF_TYPE_BOOL:
        case GGUF_TYPE_INT8:
            for (size_t i = 0; i < n; ++i) out.push_back(((const int8_t *)data)[i]);
            break;
        case GGUF_TYPE_UINT8:
            for (size_t i = 0; i < n; ++i) out.push_back(((const uint8_t *)data)[i]);
            break;
        default:
            throw ModelLoadError("GGUF key '" + key + "' is not an integer array in " + path_);
    }
    return out;
}

std::vector<std::string> GgufFile::get_str_array(const std::string & key) const {
    std::vector<std::string> out;
    const int64_t id = key_id(key);
    if (id < 0 || gguf_get_kv_type(gguf_, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(gguf_, id) != GGUF_TYPE_STRING) {
        return out;
    }
    const size_t n = gguf_get_arr_n(gguf_, id);
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) out.emplace_back(gguf_get_arr_str(gguf_, id, i));
    return out;
}

std::vector<int64_t> GgufFile::get_int_or_array(const std::string & key, size_t n, bool required, int64_t def) const {
    const int64_t id = key_id(key);
    if (id >= 0 && gguf_get_kv_type(gguf_, id) == GGUF_TYPE_ARRAY) {
        auto v = get_int_array(key);
        if (v.size() < n) {
            throw ModelLoadError("GGUF key '" + key + "' has " + std::to_string(v.size()) + " values, expected " +
                                 std::to_string(n) + " in " + path_);
        }
        v.resize(n);
        return v;
    }
    return std::vector<int64_t>(n, get_int(key, required, def));
}

ggml_tensor * GgufFile::tensor(const std::string & name) const { return ggml_get_tensor(meta_, name.c_str()); }

size_t GgufFile::tensor_file_offset(const std::string & name) const {
    const int64_t id = gguf_find_tensor(gguf_, name.c_str());
    if (id < 0) throw ModelLoadError("tensor '" + name + "' is missing in " + path_);
    return gguf_get_data_offset(gguf_) + gguf_get_tensor_offset(gguf_, id);
}

}  // namespace dflash
