#!/usr/bin/env bash
# The README's main job, at this stage of pdserve: write a tiny random-weight Llama-3-style model
# in Hugging Face format, then generate text from it in one process with the same engine the
# daemons use. Random weights give random text: the point is the path from an HF directory to
# tokens and back. Usage: scripts/demo.sh BUILD_DIR [MODEL_DIR]
set -euo pipefail
build=${1:-build}
model=${2:-$build/models/tiny-llama}

echo "demo: writing a tiny random llama model to $model"
"$build/tools/pdserve-mkmodel" --family llama --shape tiny --dtype bf16 --seed 1 --out "$model"
for prompt in "The capital of France is" "def fib(n):"; do
    echo "demo: prompt: $prompt"
    printf 'demo: completion (greedy, 32 tokens): '
    "$build/tools/pdserve-generate" --model-path "$model" --max-new-tokens 32 --temperature 0 \
        --ignore-eos "$prompt"
done
