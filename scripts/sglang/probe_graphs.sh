#!/usr/bin/env bash
# On the GPU host, after install.sh: a STANDALONE (fp8 draft, k=4) and an NGRAM (5 draft tokens, breadth 1) SGLang
# server with CUDA graphs, each started, asked one chat request and stopped; their logs stay in /tmp/probe-ALGO.log.
# Usage: [ALGOS="STANDALONE NGRAM"] bash scripts/sglang/probe_graphs.sh   (the models from `specbook models prepare`)
cat /tmp/sglsite/*.pth 2>/dev/null | head -3; ls /tmp/sglsite | grep -i cutlass
P=/tmp/sglsite/$(cat /tmp/sglsite/*.pth 2>/dev/null | grep -i cutlass | head -1)
export PYTHONPATH=/tmp/sglsite:${P:+$P:}/tmp/site SGLANG_FORCE_SHUTDOWN=1 SGLANG_GRPC_PORT=41999
python3 -c "import cutlass; print('cutlass ok')" 2>&1 | tail -1
M=$HOME/.cache/specbook/models
for algo in ${ALGOS:-STANDALONE NGRAM}; do
  if [ $algo = STANDALONE ]; then S="--speculative-algorithm STANDALONE --speculative-draft-model-path $M/smollm2-135m-instruct-fp8 --speculative-num-steps 4 --speculative-eagle-topk 1 --speculative-num-draft-tokens 5"
  else S="--speculative-algorithm NGRAM --speculative-num-draft-tokens 5 --speculative-ngram-min-bfs-breadth 1 --speculative-ngram-max-bfs-breadth 1"; fi
  t0=$SECONDS
  python3 -m sglang.launch_server --model-path $M/smollm2-135m-instruct --port 31999 --max-running-requests 16 --cuda-graph-max-bs 16 --mem-fraction-static 0.2 --enable-metrics $S > /tmp/probe-$algo.log 2>&1 &
  pid=$!
  until curl -sf localhost:31999/health >/dev/null; do kill -0 $pid 2>/dev/null || break; sleep 1; done
  echo "$algo ready=$((SECONDS-t0))s alive=$(kill -0 $pid 2>/dev/null && echo y || echo n)"
  curl -s localhost:31999/v1/chat/completions -H 'Content-Type: application/json' -d '{"model":"default","messages":[{"role":"user","content":"Count from 1 to 20."}],"max_tokens":64,"temperature":0}' | head -c 300; echo
  grep -E "Capture|Error|error" /tmp/probe-$algo.log | tail -4
  kill $pid; wait $pid 2>/dev/null
done
