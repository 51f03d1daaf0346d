#include "spec_chain.h"

#include "decode_session.h"
#include "errors.h"

#include <algorithm>

namespace dflash {

GenerateStats generate_chain(TargetEngine & target, DraftEngine & draft, const std::vector<int32_t> & prompt,
                             int max_tokens, const SamplingParams & sp, const std::vector<int32_t> & eog,
                             const TokenCallback & on_token, const ChainOptions & opt, SpecStats & stats) {
    DecodeSession session(target, &draft, prompt, max_tokens, sp, eog, opt);
    GenerateStats st;
    bool stopped = false;
    while (!session.done() && !stopped) {
        for (int32_t tok : session.step()) {
            if (!on_token(tok)) {
                stopped = true;
                break;
            }
        }
    }
    st = session.stats();
    if (stopped) st.stop_reason = "callback";
    stats = session.spec();
    return st;
}

}  // namespace dflash
