#!/usr/bin/env python3
"""test_chart_e2e.py — the chart's command lines, run: the three containers of the CPU values
(deploy/helm/pdserve/ci/cpu-values.yaml) started on 127.0.0.1 exactly as rendered, and one
request served through the router.

What is taken from the rendered manifests, unchanged: each container's command (the image's
/usr/local/bin/pdserve-X maps to this build's binary) and every argument, and the container's
env (UCX settings; env from Secrets resolved from the rendered Secret, as the kubelet does, and
$(VAR) references in args expanded from that env, as the kubelet does).
The only substitutions, and why (what Kubernetes gives a pod that one machine cannot):
  * --host 0.0.0.0              -> 127.0.0.1 (each pod has its own network namespace; here all
                                   three share one, so listen on loopback only)
  * --port, --disaggregation-bootstrap-port
                                -> free ports (every pod may use 30000; here they would collide)
  * --prefill-dns / --decode-dns <svc>.<ns>.svc.cluster.local:PORT[:BOOT]
                                -> localhost:PORT[:BOOT] with the free ports (localhost is the
                                   name resolving to this machine, as the headless Service name
                                   resolves to the pods)
  * paths under a volumeMount (the model at /models/..., the secret file
    /etc/pdserve/secrets/cluster-key) -> the same path under a temp directory that holds what
                                   the volume would: a tiny model by pdserve-mkmodel, and the
                                   rendered Secret's cluster-key
The test asserts that nothing else differs from the rendered arguments.

The router's --prefill-dns/--decode-dns may not be in this build yet: then the workers are still
started and checked healthy with their rendered args, and the test exits 77 (skipped), saying so.

Usage: test_chart_e2e.py BUILD_DIR [RENDERER]   (PyYAML needed; else exit 77)
"""
import base64
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import pd_cluster as pc  # noqa: E402

try:
    import yaml
except ImportError:
    print("test_chart_e2e: SKIP: PyYAML missing (Debian python3-yaml: scripts/setup.sh)")
    sys.exit(77)

CHART = os.path.join(ROOT, "deploy", "helm", "pdserve")
VALUES = os.path.join(CHART, "ci", "cpu-values.yaml")
RELEASE, NAMESPACE = "pd", "llm"
SUBSTITUTED = {"--host", "--port", "--disaggregation-bootstrap-port", "--prefill-dns",
               "--decode-dns", "--model-path", "--cluster-key"}


def render(go_renderer):
    helm = shutil.which("helm")
    if helm:
        cmd, name = [helm, "template", RELEASE, CHART, "--namespace", NAMESPACE, "-f",
                     VALUES], "helm template"
    elif go_renderer and os.access(go_renderer, os.X_OK):
        cmd, name = [go_renderer, "--name", RELEASE, "--namespace", NAMESPACE, "-f", VALUES,
                     CHART], "pdserve-helm-render"
    else:
        print("test_chart_e2e: SKIP: neither helm nor pdserve-helm-render is here")
        sys.exit(77)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit("test_chart_e2e: render failed: %s" % p.stderr)
    print("test_chart_e2e: renderer: %s" % name)
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def kubelet_env(container, secrets):
    """The container's env as the kubelet builds it: values, and secretKeyRefs read from the
    rendered Secrets."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = base64.b64decode(secrets[ref["name"]]["data"][ref["key"]]).decode()
    return env


def expand(arg, env):
    """Kubernetes' $(VAR) expansion in command/args ($$ escapes)."""
    return re.sub(r"\$\$|\$\((\w+)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)


def main():
    build = sys.argv[1]
    objs = render(sys.argv[2] if len(sys.argv) > 2 else None)
    deps = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d
            for d in objs if d["kind"] == "Deployment"}
    secrets = {s["metadata"]["name"]: s for s in objs if s["kind"] == "Secret"}
    tmp = pc.tmpdir()
    pods = {}
    for k, d in deps.items():
        spec = d["spec"]["template"]["spec"]
        c = spec["containers"][0]
        # the volumes a pod would see, laid out under tmp/<role>/
        mounts = {}
        for m in c.get("volumeMounts", []):
            vol = next(v for v in spec["volumes"] if v["name"] == m["name"])
            host = os.path.join(tmp, k, m["mountPath"].strip("/").replace("/", "_"))
            os.makedirs(host, exist_ok=True)
            if "secret" in vol:
                s = secrets[vol["secret"]["secretName"]]
                for it in vol["secret"].get("items", []):
                    with open(os.path.join(host, it["path"]), "wb") as f:
                        f.write(base64.b64decode(s["data"][it["key"]]))
            mounts[m["mountPath"]] = (host, vol)
        env = kubelet_env(c, secrets)
        cmd = [expand(a, env) for a in c["command"] + c.get("args", [])]
        pods[k] = {"cmd": cmd, "rendered": c["command"] + c.get("args", []), "env": env,
                   "mounts": mounts}
    print("test_chart_e2e: rendered command lines:")
    for k in ("prefill", "decode", "router"):
        print("  %s: %s" % (k, " ".join(pods[k]["rendered"])))

    # the model volume holds a tiny model at the rendered --model-path
    model_arg = None
    for k in ("prefill", "decode"):
        a = pods[k]["cmd"]
        model_arg = a[a.index("--model-path") + 1]
    ports = {"prefill": pc.free_port(), "decode": pc.free_port(), "router": pc.free_port()}
    boot = pc.free_port()

    def host_path(k, path):
        for mp, (host, _) in sorted(pods[k]["mounts"].items(), key=lambda x: -len(x[0])):
            if path == mp or path.startswith(mp.rstrip("/") + "/"):
                return host + path[len(mp.rstrip("/")):]
        raise SystemExit("test_chart_e2e: %s: %s is under no volumeMount" % (k, path))

    model_host = host_path("prefill", model_arg)
    subprocess.run([os.path.join(build, "tools", "pdserve-mkmodel"), "--family", "llama",
                    "--shape", "tiny", "--dtype", "bf16", "--seed", "1", "--out", model_host],
                   check=True, capture_output=True, timeout=120)
    dec_model = host_path("decode", model_arg)
    if dec_model != model_host:
        shutil.copytree(model_host, dec_model, dirs_exist_ok=True)

    def substitute(k):
        a = list(pods[k]["cmd"])
        a[0] = os.path.join(build, k, os.path.basename(a[0]))
        for i in range(1, len(a) - 1):
            f, v = a[i], a[i + 1]
            if f == "--host":
                a[i + 1] = "127.0.0.1"
            elif f == "--port":
                a[i + 1] = str(ports[k])
            elif f == "--disaggregation-bootstrap-port":
                a[i + 1] = str(boot)
            elif f == "--prefill-dns":
                parts = v.split(":")
                assert len(parts) == 3, v
                a[i + 1] = "localhost:%d:%d" % (ports["prefill"], boot)
            elif f == "--decode-dns":
                assert len(v.split(":")) == 2, v
                a[i + 1] = "localhost:%d" % ports["decode"]
            elif f in ("--model-path", "--cluster-key"):
                a[i + 1] = host_path(k, v)
        # nothing but the listed flags' values changed
        for i, (x, y) in enumerate(zip(pods[k]["cmd"][1:], a[1:]), start=1):
            if x != y and pods[k]["cmd"][i - 1] not in SUBSTITUTED:
                raise SystemExit("test_chart_e2e: %s arg %d changed: %s -> %s" % (k, i, x, y))
        return a

    procs = {}
    failed = []
    try:
        for k in ("prefill", "decode"):
            args = substitute(k)
            env = dict(os.environ)
            env.update(pods[k]["env"])
            print("test_chart_e2e: starting %s: %s" % (k, " ".join(args)))
            procs[k] = pc.Proc(k, args, ports[k], tmp, env=env, ready_timeout=90)
        for k in ("prefill", "decode"):
            st, body = procs[k].get("/server_info")
            info = json.loads(body) if st == 200 else {}
            print("test_chart_e2e: %s healthy; transfer_transport %s" % (
                k, info.get("transfer_transport")))

        args = substitute("router")
        env = dict(os.environ)
        env.update(pods["router"]["env"])
        print("test_chart_e2e: starting router: %s" %
              " ".join("<api-key>" if pods["router"]["env"].get("PDSERVE_API_KEY") == x else x
                       for x in args))
        # not waiting for /health here: it needs the workers found first (checked below)
        procs["router"] = pc.Proc("router", args, ports["router"], tmp, env=env,
                                  wait_ready=False)
        rt = procs["router"]
        key = pods["router"]["env"].get("PDSERVE_API_KEY")
        auth = {"Authorization": "Bearer " + key} if key else {}

        # the router found both workers through their names: its /health is 200 only while it
        # has a healthy prefill and a healthy decode worker
        def router_health():
            if rt.p.poll() is not None:
                raise SystemExit("test_chart_e2e: FAIL: the router exited (rc %s) at start with "
                                 "the chart's args:\n%s" % (rt.p.returncode, rt.log_tail()))
            return rt.get("/health", headers={})[0] == 200
        if not pc.wait_until(router_health, 30, 0.2):
            failed.append("router /health not 200 within 30 s: it did not find both workers "
                          "by --prefill-dns/--decode-dns")

        body = {"model": "tiny-llama", "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "hello from the chart"}]}
        if key:
            st, raw = rt.post("/v1/chat/completions", body, headers={})
            if st != 401:
                failed.append("no API key: router answered %d, not 401" % st)
        st, raw = rt.post("/v1/chat/completions", body, headers=auth, timeout=120)
        if st != 200:
            failed.append("chat completion through the router: %d %r" % (st, raw[:300]))
        else:
            r = json.loads(raw)
            n = r["usage"]["completion_tokens"]
            text = r["choices"][0]["message"]["content"]
            print("test_chart_e2e: router answered 200: %d completion tokens, %r" % (n, text))
            if r.get("model") != "tiny-llama" or n < 1:
                failed.append("unexpected answer: %r" % r)
        for k in ("router", "decode", "prefill"):
            rc = procs[k].terminate(60)
            if rc != 0:
                failed.append("%s exited %s after SIGTERM" % (k, rc))
    finally:
        pc.kill_all()
    if failed:
        for f in failed:
            print("FAIL: " + f)
        for k, p in procs.items():
            print("--- %s log" % k)
            print(p.log_tail())
        sys.exit(1)
    print("test_chart_e2e: PASS")


if __name__ == "__main__":
    main()
