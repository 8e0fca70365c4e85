#!/usr/bin/env bash
# Start an SGLang server for eagledata: python -m sglang.launch_server "$@".
#
# eagledata serves only a bf16 KV cache (an fp8 KV cache degraded Kimi-K2.5 and poisons the
# drafter's training data). `eagledata launch-server` already checks the arguments; this script
# checks them again, so a hand-typed command cannot slip an fp8/fp4/auto KV cache through:
#   * exactly bf16/bfloat16 after every --kv-cache-dtype (also --kv-cache-dtype=VALUE and the
#     abbreviations argparse accepts, such as --kv-cache);
#   * at least one --kv-cache-dtype;
#   * exactly bf16/bfloat16 after every --speculative-draft-kv-cache-dtype (SGLang 0.5.23: the
#     draft model's own KV dtype; by default it follows --kv-cache-dtype);
#   * no --quantization-param-path (fp8 KV scales) and no --config (a YAML could set the dtype).
#
# SGLANG_PYTHON picks the interpreter (default: python).
set -euo pipefail

readonly KV_FLAG="--kv-cache-dtype"
readonly DRAFT_KV_FLAG="--speculative-draft-kv-cache-dtype"
readonly SCALES_FLAG="--quantization-param-path"
readonly CONFIG_FLAG="--config"

refuse() {
    printf 'launch_sglang.sh: refused: %s\n' "$1" >&2
    exit 2
}

# True when argparse could read $1 as the long flag $2: the flag itself or a prefix of it
# at least $3 characters long.
means_flag() {
    local name="$1" flag="$2" min_length="$3"
    [[ ${#name} -ge $min_length && "$flag" == "$name"* ]]
}

check_kv_value() {
    local flag="$1" value="$2"
    case "$value" in
        bf16 | bfloat16) ;;
        *) refuse "$flag $value: only a bf16 KV cache is allowed (fp8 degraded Kimi-K2.5 and poisons drafter data); pass $KV_FLAG bf16" ;;
    esac
}

kv_seen=0
pending_kv_flag=""
pending_is_target=0
for arg in "$@"; do
    if [[ -n "$pending_kv_flag" ]]; then
        check_kv_value "$pending_kv_flag" "$arg"
        pending_kv_flag=""
        [[ "$pending_is_target" -eq 1 ]] && kv_seen=1
        continue
    fi
    [[ "$arg" == --* ]] || continue
    name="${arg%%=*}"
    if means_flag "$name" "$KV_FLAG" 6 || means_flag "$name" "$DRAFT_KV_FLAG" 21; then
        target=0
        means_flag "$name" "$KV_FLAG" 6 && target=1
        if [[ "$arg" == *=* ]]; then
            check_kv_value "$name" "${arg#*=}"
            [[ "$target" -eq 1 ]] && kv_seen=1
        else
            pending_kv_flag="$name"
            pending_is_target=$target
        fi
    elif means_flag "$name" "$SCALES_FLAG" 15; then
        refuse "$name: fp8 KV scaling factors are never used with a bf16 KV cache; remove it"
    elif means_flag "$name" "$CONFIG_FLAG" 6; then
        refuse "$name: a YAML config could set the KV cache dtype; pass flags on the command line"
    fi
done

if [[ -n "$pending_kv_flag" ]]; then
    refuse "$pending_kv_flag needs a value; pass $KV_FLAG bf16"
fi
if [[ "$kv_seen" -eq 0 ]]; then
    refuse "no $KV_FLAG given; pass $KV_FLAG bf16"
fi

exec "${SGLANG_PYTHON:-python}" -m sglang.launch_server "$@"
