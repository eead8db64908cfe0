#!/usr/bin/env bash
# Serve a LoRA reward model: a base sequence-classification model plus a PEFT adapter.
#
#   BASE_MODEL=Qwen/Qwen2.5-0.5B ADAPTER=your-org/qwen-rm-lora ./examples/serve_lora_reward_model.sh
#
# BASE_MODEL and ADAPTER are hub ids or local folders. MERGE=1 merges the adapter into the
# base weights at load time (faster scoring; the adapter can no longer be swapped). Every
# other setting comes from REWARD_SERVER_* variables or extra flags passed to this script,
# e.g. `./examples/serve_lora_reward_model.sh --port 9000 --dtype bfloat16`.
set -euo pipefail

: "${BASE_MODEL:?set BASE_MODEL to the base model (hub id or folder)}"
: "${ADAPTER:?set ADAPTER to the PEFT adapter (hub id or folder)}"

args=(--model "$BASE_MODEL" --adapter "$ADAPTER")
if [ "${MERGE:-0}" = "1" ]; then
  args+=(--merge-adapter)
fi

# exec: signals (Ctrl-C, SIGTERM from a supervisor) reach the server directly.
exec "${REWARD_SERVER:-reward-server}" "${args[@]}" "$@"
