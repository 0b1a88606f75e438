"""R3's client, run on a node by the engine's interpreter: POST every prompt to the engine on the node's
loopback (the engine listens there only), and read the engine's metrics right before and after, on the node.

argv: URL MODEL PROMPTS_JSON MAX_TOKENS TIMEOUT_S. Prints one JSON object: ``metrics_before`` and
``metrics_after`` (the Prometheus text as served) and ``records`` (id, ok, elapsed_s, usage or error).
Stdlib only: the node needs no kvgate."""

import json
import sys
import time
import urllib.request


def metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        return r.read().decode()


def main(argv: list[str]) -> None:
    url, model, prompts_path, max_tokens, timeout_s = argv[1:6]
    before = metrics(url)
    records = []
    with open(prompts_path) as f:
        prompts = json.load(f)
    for p in prompts:
        body = json.dumps({"model": model, "prompt": p["ids"], "max_tokens": int(max_tokens),
                           "stream": False}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        t0 = time.time()
        try:
            with urllib.request.urlopen(req, timeout=float(timeout_s)) as r:
                out = json.loads(r.read())
            records.append({"id": p["id"], "ok": True, "elapsed_s": time.time() - t0, "usage": out.get("usage")})
        except Exception as exc:  # noqa: BLE001 - a failed request is a record, not a crash
            records.append({"id": p["id"], "ok": False, "elapsed_s": time.time() - t0, "error": repr(exc)[:300]})
    print(json.dumps({"metrics_before": before, "records": records, "metrics_after": metrics(url)}))


if __name__ == "__main__":
    main(sys.argv)
