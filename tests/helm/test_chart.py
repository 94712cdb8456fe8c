#!/usr/bin/env python3
"""test_chart.py — the Helm chart deploy/helm/pdserve, checked without a cluster.

For every values file in deploy/helm/pdserve/ci/:
  * the merged values validate against values.schema.json (python3-jsonschema);
  * the chart renders: with `helm template` when helm is installed, else with the Go renderer
    deploy/helm/render (text/template + Sprig); the test prints which one ran;
  * every rendered object validates against the Kubernetes OpenAPI schema (kubernetes-validate,
    strict: unknown fields fail) — the Prometheus Operator's PodMonitor/ServiceMonitor are not
    in that schema and get structural checks here instead;
  * the rendered output passes yamllint (deploy/helm/.yamllint);
  * the Grafana dashboard ConfigMap exists exactly when grafana.dashboard.enabled, carries the
    sidecar's label, and holds deploy/grafana/pdserve.json byte for byte;
  * the wiring holds: ports agree between Services, containers, probes and flags; the router's
    --prefill-dns/--decode-dns name the headless Services' FQDNs and ports; selectors (Services,
    PDBs, NetworkPolicies, monitors) pick exactly the intended pods; the NetworkPolicies let only
    decode reach the bootstrap port and only the router reach the workers' HTTP ports; every
    Secret reference resolves; every daemon flag exists in the binary's --help.
And the failures: a wrong type (prefill.replicas: "two") and a typo (prefil:) are refused by the
schema with a message naming the key; a too short terminationGracePeriodSeconds fails the render
with a message naming it; kubernetes-validate refuses a broken object and yamllint a badly
indented document (so neither check can pass vacuously).

Usage: test_chart.py BUILD_DIR [RENDERER]   (RENDERER: the built pdserve-helm-render)
Needs PyYAML and jsonschema (Debian python3-yaml, python3-jsonschema), yamllint and
kubernetes-validate (scripts/setup.sh installs it into .venv-tools/; this script re-runs itself
with .venv-tools/bin/python when that has it). Missing tools: the other checks still run, then
exit 77 (skipped) naming what was missing.
"""
import base64
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = os.environ.get("PD_CHART_DIR") or os.path.join(ROOT, "deploy", "helm", "pdserve")
YAMLLINT_CONF = os.path.join(ROOT, "deploy", "helm", ".yamllint")
VENV_PY = os.path.join(ROOT, ".venv-tools", "bin", "python")
RELEASE, NAMESPACE = "pd", "llm"
KUBE_VERSION = os.environ.get("PD_KUBE_VERSION", "1.31.0")


def maybe_reexec():
    """Runs again under .venv-tools' Python when this one lacks kubernetes_validate."""
    try:
        import kubernetes_validate  # noqa: F401
        return
    except ImportError:
        pass
    if os.path.exists(VENV_PY) and os.path.realpath(sys.executable) != os.path.realpath(VENV_PY) \
            and not os.environ.get("PD_CHART_REEXEC"):
        os.environ["PD_CHART_REEXEC"] = "1"
        os.execv(VENV_PY, [VENV_PY] + sys.argv)


maybe_reexec()

try:
    import yaml
    import jsonschema
except ImportError as e:
    print("test_chart: SKIP: %s (install python3-yaml python3-jsonschema: scripts/setup.sh)" % e)
    sys.exit(77)
try:
    import kubernetes_validate
except ImportError:
    kubernetes_validate = None

FAILS = []
MISSING = []
NOTES = set()


def check(cond, msg):
    if not cond:
        FAILS.append(msg)
        print("FAIL: " + msg)
    return cond


# ---- values and rendering ----

def merge(dst, src):
    """Helm's coalescing of a values file over the defaults: maps merge, a null deletes."""
    for k, v in src.items():
        if v is None:
            dst.pop(k, None)
        elif isinstance(v, dict) and isinstance(dst.get(k), dict):
            merge(dst[k], v)
        else:
            dst[k] = v
    return dst


def load_yaml(path):
    with open(path) as f:
        return yaml.safe_load(f) or {}


def merged_values(*files, extra=None):
    v = load_yaml(os.path.join(CHART, "values.yaml"))
    for f in files:
        merge(v, load_yaml(f))
    if extra:
        merge(v, copy.deepcopy(extra))
    return v


SCHEMA = json.load(open(os.path.join(CHART, "values.schema.json")))
jsonschema.Draft7Validator.check_schema(SCHEMA)


def schema_errors(values):
    """Messages in the shape helm prints: '<key.path>: <problem>'."""
    out = []
    for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(values):
        path = ".".join(str(p) for p in e.absolute_path) or "(root)"
        out.append("%s: %s" % (path, e.message))
    return out


class Renderer:
    def __init__(self, go_renderer):
        self.helm = shutil.which("helm")
        self.go = go_renderer if go_renderer and os.access(go_renderer, os.X_OK) else None
        if self.helm:
            self.name = "helm template (%s)" % subprocess.run(
                [self.helm, "version", "--short"], capture_output=True, text=True).stdout.strip()
        elif self.go:
            self.name = "pdserve-helm-render (Go text/template + Sprig: deploy/helm/render)"
        else:
            self.name = None

    def run(self, files=(), sets=(), notes=False):
        """(returncode, stdout, stderr) of rendering the chart."""
        if self.helm:
            cmd = [self.helm, "template", RELEASE, CHART, "--namespace", NAMESPACE,
                   "--kube-version", KUBE_VERSION]
        else:
            cmd = [self.go, "--name", RELEASE, "--namespace", NAMESPACE, CHART]
            if notes:
                cmd.append("--notes")
        for f in files:
            cmd += ["-f", f]
        for s in sets:
            cmd += ["--set", s]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout, p.stderr

    def objects(self, files=(), sets=()):
        rc, out, err = self.run(files, sets)
        if rc != 0:
            raise RuntimeError("render failed (%d): %s" % (rc, err.strip()))
        return out, [d for d in yaml.safe_load_all(out) if d]


# ---- helpers over rendered objects ----

def by_kind(objs, kind):
    return [o for o in objs if o.get("kind") == kind]


def named(objs, kind, name):
    for o in by_kind(objs, kind):
        if o["metadata"]["name"] == name:
            return o
    return None


def component(o):
    return o["metadata"]["labels"]["app.kubernetes.io/component"]


def pod_labels(dep):
    return dep["spec"]["template"]["metadata"]["labels"]


def selects(selector, labels):
    """A label selector ({matchLabels, matchExpressions} or a plain map) against labels."""
    if selector is None:
        return False
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        have = e["key"] in labels
        if e["operator"] == "In" and (not have or labels[e["key"]] not in e["values"]):
            return False
        if e["operator"] == "NotIn" and have and labels[e["key"]] in e["values"]:
            return False
        if e["operator"] == "Exists" and not have:
            return False
        if e["operator"] == "DoesNotExist" and have:
            return False
    return True


def flag(args, name):
    """The value after a flag in an argument list, or None."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def container_port(c, name):
    for p in c.get("ports", []):
        if p["name"] == name:
            return p["containerPort"]
    return None


def resolve_port(c, port):
    """A Service targetPort / probe port / policy port (name or number) as a number."""
    if isinstance(port, int):
        return port
    return container_port(c, port)


HELP_CACHE = {}


def help_flags(binary):
    if binary not in HELP_CACHE:
        p = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
        HELP_CACHE[binary] = set(re.findall(r"^\s+(--[a-z0-9-]+)", p.stdout, re.M))
    return HELP_CACHE[binary]


# ---- the wiring checks of one render ----

def check_wiring(tag, values, objs, build):
    deps = {component(d): d for d in by_kind(objs, "Deployment")}
    check(set(deps) == {"router", "prefill", "decode"}, "%s: Deployments %s" % (tag, sorted(deps)))
    if set(deps) != {"router", "prefill", "decode"}:
        return
    cont = {k: d["spec"]["template"]["spec"]["containers"][0] for k, d in deps.items()}
    args = {k: c["args"] for k, c in cont.items()}
    svcs = {o["metadata"]["name"]: o for o in by_kind(objs, "Service")}
    all_pods = {k: pod_labels(d) for k, d in deps.items()}

    for k, d in deps.items():
        check(d["spec"]["replicas"] == values[k]["replicas"],
              "%s: %s replicas %s != values %s" % (tag, k, d["spec"]["replicas"],
                                                  values[k]["replicas"]))
        check(selects(d["spec"]["selector"], pod_labels(d)),
              "%s: %s selector does not select its own pods" % (tag, k))
        c = cont[k]
        # the HTTP port: flag == containerPort; probes on /health of that port
        check(str(container_port(c, "http")) == flag(args[k], "--port"),
              "%s: %s --port %s != containerPort http %s" % (tag, k, flag(args[k], "--port"),
                                                            container_port(c, "http")))
        check(flag(args[k], "--host") == "0.0.0.0", "%s: %s must listen on 0.0.0.0" % (tag, k))
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            p = c.get(probe)
            if k == "router" and probe != "readinessProbe":
                # the router's /health needs healthy workers: liveness/startup only check it
                # listens, so loading or restarting workers do not get it killed
                check(p and "tcpSocket" in p and
                      resolve_port(c, p["tcpSocket"]["port"]) == container_port(c, "http"),
                      "%s: router %s is not a TCP check of the http port" % (tag, probe))
                continue
            check(p and p["httpGet"]["path"] == "/health" and
                  resolve_port(c, p["httpGet"]["port"]) == container_port(c, "http"),
                  "%s: %s %s is not GET /health on the http port" % (tag, k, probe))
        sp = c["startupProbe"]
        check(sp["periodSeconds"] * sp["failureThreshold"] >= (600 if k != "router" else 30),
              "%s: %s startupProbe allows only %d s" % (tag, k,
                                                       sp["periodSeconds"] * sp["failureThreshold"]))
        # draining: preStop sleep + the binary's --shutdown-timeout fit in the grace period
        grace = d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        sleep = int(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else 0
        shutdown = float(flag(args[k], "--shutdown-timeout"))
        check(sleep > 0, "%s: %s has no preStop sleep" % (tag, k))
        check(grace >= sleep + shutdown, "%s: %s grace %d < preStop %d + --shutdown-timeout %g"
              % (tag, k, grace, sleep, shutdown))
        # env references to Secrets resolve; $(VAR) in args names a defined env var
        env_names = {e["name"] for e in c.get("env", [])}
        for a in args[k]:
            for var in re.findall(r"\$\((\w+)\)", a):
                check(var in env_names, "%s: %s arg %s names undefined env %s" % (tag, k, a, var))
        check_secret_refs(tag, k, values, objs, d)

    # workers: model, shm, role labels, flags known to the binaries
    for k in ("prefill", "decode"):
        c, spec = cont[k], deps[k]["spec"]["template"]["spec"]
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        vols = {v["name"]: v for v in spec["volumes"]}
        check(mounts.get("model", {}).get("readOnly") is True, "%s: %s model not read-only"
              % (tag, k))
        mp = flag(args[k], "--model-path")
        check(mp and mp.startswith(mounts["model"]["mountPath"]),
              "%s: %s --model-path %s outside the model mount" % (tag, k, mp))
        src = values["model"]["source"]
        key = {"pvc": "persistentVolumeClaim", "hostPath": "hostPath", "image": "image"}[src]
        check(key in vols.get("model", {}), "%s: %s model volume is not %s" % (tag, k, key))
        if key == "persistentVolumeClaim":
            check(vols["model"][key].get("readOnly") is True, "%s: %s PVC not readOnly" % (tag, k))
        if values[k]["shm"]["enabled"]:
            check(mounts.get("shm", {}).get("mountPath") == "/dev/shm" and
                  vols["shm"]["emptyDir"].get("medium") == "Memory",
                  "%s: %s /dev/shm is not a memory emptyDir" % (tag, k))
        labels = pod_labels(deps[k])
        check(labels.get("pdserve.io/role") == k and labels.get("llm-d.ai/role") == k,
              "%s: %s role labels %s" % (tag, k, labels))
        caps = c["securityContext"]["capabilities"].get("add", [])
        check(("IPC_LOCK" in caps) == values[k]["ipcLock"], "%s: %s IPC_LOCK %s" % (tag, k, caps))
        check(bool(spec.get("hostNetwork")) == values[k]["hostNetwork"] and
              bool(spec.get("hostIPC")) == values[k]["hostIPC"],
              "%s: %s hostNetwork/hostIPC do not follow values" % (tag, k))
        check(c["resources"] == values[k]["resources"], "%s: %s resources %s != values %s"
              % (tag, k, c["resources"], values[k]["resources"]))
        binary = os.path.join(build, k, "pdserve-" + k)
        if os.access(binary, os.X_OK):
            known = help_flags(binary)
            for a in args[k]:
                if a.startswith("--"):
                    check(a in known, "%s: %s flag %s is not in pdserve-%s --help" % (tag, k, a, k))
        else:
            MISSING.append("%s (flags not checked against --help)" % binary)
        check(c["command"] == ["/usr/local/bin/pdserve-" + k], "%s: %s command %s"
              % (tag, k, c["command"]))
        ucx_env = {e["name"]: e.get("value") for e in c.get("env", [])}
        check(ucx_env.get("UCX_TCP_PORT_RANGE") == values["ucx"]["tcpPortRange"],
              "%s: %s UCX_TCP_PORT_RANGE %s" % (tag, k, ucx_env.get("UCX_TCP_PORT_RANGE")))

    # prefill: bootstrap flag == containerPort == annotation
    boot = container_port(cont["prefill"], "bootstrap")
    check(flag(args["prefill"], "--disaggregation-bootstrap-port") == str(boot),
          "%s: prefill bootstrap flag %s != containerPort %s"
          % (tag, flag(args["prefill"], "--disaggregation-bootstrap-port"), boot))
    ann = deps["prefill"]["spec"]["template"]["metadata"]["annotations"]
    check(ann.get("pdserve.io/bootstrap-port") == str(boot),
          "%s: bootstrap-port annotation %s" % (tag, ann.get("pdserve.io/bootstrap-port")))
    check(flag(args["decode"], "--disaggregation-bootstrap-port") is None,
          "%s: decode must not carry a bootstrap port flag" % tag)

    # headless Services: select their pods only; port == containerPort (DNS gives pod IPs,
    # so the router dials the pod's port directly)
    for k in ("prefill", "decode"):
        name = "%s-pdserve-%s" % (RELEASE, k)
        s = svcs.get(name)
        if not check(s is not None, "%s: no headless Service %s" % (tag, name)):
            continue
        check(s["spec"].get("clusterIP") == "None", "%s: %s is not headless" % (tag, name))
        check(not s["spec"].get("publishNotReadyAddresses"),
              "%s: %s publishes not-ready pods" % (tag, name))
        for other, labels in all_pods.items():
            check(selects(s["spec"]["selector"], labels) == (other == k),
                  "%s: Service %s selection of %s pods is wrong" % (tag, name, other))
        ports = {p["name"]: p for p in s["spec"]["ports"]}
        want = {"http", "bootstrap"} if k == "prefill" else {"http"}
        check(set(ports) == want, "%s: %s ports %s" % (tag, name, sorted(ports)))
        for pn, p in ports.items():
            check(p["port"] == resolve_port(cont[k], p["targetPort"]) == container_port(cont[k], pn),
                  "%s: %s port %s: %s -> %s, container %s" % (tag, name, pn, p["port"],
                                                             p["targetPort"],
                                                             container_port(cont[k], pn)))

    # router: DNS flags name the headless Services' FQDNs and ports
    fqdn = lambda k: "%s-pdserve-%s.%s.svc.cluster.local" % (RELEASE, k, NAMESPACE)
    want_p = "%s:%d:%d" % (fqdn("prefill"), container_port(cont["prefill"], "http"), boot)
    want_d = "%s:%d" % (fqdn("decode"), container_port(cont["decode"], "http"))
    check(flag(args["router"], "--prefill-dns") == want_p,
          "%s: router --prefill-dns %s != %s" % (tag, flag(args["router"], "--prefill-dns"), want_p))
    check(flag(args["router"], "--decode-dns") == want_d,
          "%s: router --decode-dns %s != %s" % (tag, flag(args["router"], "--decode-dns"), want_d))
    check("--pd-disaggregation" in args["router"], "%s: router lacks --pd-disaggregation" % tag)
    check((flag(args["router"], "--api-key") is not None) == values["auth"]["apiKey"]["enabled"],
          "%s: router --api-key does not follow auth.apiKey.enabled" % tag)
    for k in ("prefill", "decode"):
        want_key = values["auth"]["apiKey"]["enabled"] and values["auth"]["apiKey"]["workers"]
        check((flag(args[k], "--api-key") is not None) == want_key,
              "%s: %s --api-key does not follow auth.apiKey.workers" % (tag, k))
    rsvc = svcs.get("%s-pdserve-router" % RELEASE)
    if check(rsvc is not None, "%s: no router Service" % tag):
        for other, labels in all_pods.items():
            check(selects(rsvc["spec"]["selector"], labels) == (other == "router"),
                  "%s: router Service selection of %s pods is wrong" % (tag, other))
        p = rsvc["spec"]["ports"][0]
        check(resolve_port(cont["router"], p["targetPort"]) == values["router"]["port"] and
              p["port"] == values["router"]["service"]["port"],
              "%s: router Service port %s -> %s" % (tag, p["port"], p["targetPort"]))
    rbin = os.path.join(build, "router", "pdserve-router")
    if check(os.access(rbin, os.X_OK), "%s: %s is not built" % (tag, rbin)):
        known = help_flags(rbin)
        for a in args["router"]:
            if a.startswith("--"):
                check(a in known, "%s: router flag %s is not in pdserve-router --help" % (tag, a))

    check_network_policies(tag, values, objs, deps, cont)
    check_pdbs(tag, values, objs, all_pods)
    check_monitors(tag, values, objs, all_pods)


def check_secret_refs(tag, k, values, objs, dep):
    spec = dep["spec"]["template"]["spec"]
    secrets = {s["metadata"]["name"]: s for s in by_kind(objs, "Secret")}
    existing = values["auth"]["existingSecret"]
    refs = []
    for c in spec["containers"]:
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs.append((ref["name"], ref["key"]))
    for v in spec.get("volumes", []):
        if "secret" in v:
            for it in v["secret"].get("items", []):
                refs.append((v["secret"]["secretName"], it["key"]))
    for name, key in refs:
        if name == existing and existing:
            check(name not in secrets, "%s: existingSecret %s rendered too" % (tag, name))
            continue
        s = secrets.get(name)
        check(s is not None and key in s.get("data", {}),
              "%s: %s references secret %s key %s, which is not rendered" % (tag, k, name, key))
        if s is not None and key in s.get("data", {}):
            raw = base64.b64decode(s["data"][key])
            check(len(raw) >= 32, "%s: secret %s key %s is only %d bytes" % (tag, name, key,
                                                                           len(raw)))
    if k != "router":
        check(flag(dep["spec"]["template"]["spec"]["containers"][0]["args"], "--cluster-key")
              == "/etc/pdserve/secrets/cluster-key" and
              any(m["mountPath"] == "/etc/pdserve/secrets" for m in
                  spec["containers"][0]["volumeMounts"]),
              "%s: %s --cluster-key is not the mounted secret file" % (tag, k))


def peer_admits(rule, labels, ns_labels):
    """Whether a NetworkPolicy ingress rule's `from` admits a pod (same namespace unless a
    namespaceSelector is given)."""
    frm = rule.get("from")
    if not frm:
        return True
    for p in frm:
        ns_ok = selects(p["namespaceSelector"], ns_labels) if "namespaceSelector" in p \
            else ns_labels.get("kubernetes.io/metadata.name") == NAMESPACE
        pod_ok = selects(p["podSelector"], labels) if "podSelector" in p else True
        if ns_ok and pod_ok:
            return True
    return False


def port_admitted(rule, c, port):
    ports = rule.get("ports")
    if not ports:
        return True
    for p in ports:
        lo = resolve_port(c, p["port"])
        hi = p.get("endPort", lo)
        if lo is not None and lo <= port <= hi:
            return True
    return False


def check_network_policies(tag, values, objs, deps, cont):
    nps = by_kind(objs, "NetworkPolicy")
    if not values["networkPolicy"]["enabled"]:
        check(not nps, "%s: NetworkPolicies rendered while disabled" % tag)
        return
    own_ns = {"kubernetes.io/metadata.name": NAMESPACE}
    m = values["networkPolicy"]["metrics"]
    scraper_ns = dict((m["namespaceSelector"] or {}).get("matchLabels") or {})
    scraper = dict((m["podSelector"] or {}).get("matchLabels") or {})
    stranger = {"app": "somebody-else"}
    ucx_lo = int(values["ucx"]["tcpPortRange"].split("-")[0])
    for k, d in deps.items():
        mine = [n for n in nps if selects(n["spec"]["podSelector"], pod_labels(d))]
        check(len(mine) == 1, "%s: %d NetworkPolicies select %s pods" % (tag, len(mine), k))
        if len(mine) != 1:
            continue
        rules = mine[0]["spec"].get("ingress", [])
        c = cont[k]

        def admitted(labels, ns, port):
            return any(peer_admits(r, labels, ns) and port_admitted(r, c, port) for r in rules)
        http = container_port(c, "http")
        pods = {n: pod_labels(x) for n, x in deps.items()}
        if k == "router":
            if not values["networkPolicy"]["routerFrom"]:
                check(admitted(stranger, own_ns, http), "%s: router port closed to clients" % tag)
            continue
        check(admitted(pods["router"], own_ns, http), "%s: router cannot reach %s http" % (tag, k))
        peer = "decode" if k == "prefill" else "prefill"
        check(not admitted(pods[peer], own_ns, http) and not admitted(stranger, own_ns, http),
              "%s: %s http open beyond the router" % (tag, k))
        if scraper_ns:
            check(admitted(scraper, scraper_ns, http), "%s: scraper cannot reach %s /metrics"
                  % (tag, k))
            if scraper:
                check(not admitted({"app": "x"}, scraper_ns, http),
                      "%s: %s http open to any pod of the metrics namespace" % (tag, k))
        check(admitted(pods[peer], own_ns, ucx_lo), "%s: %s cannot reach %s UCX port %d"
              % (tag, peer, k, ucx_lo))
        check(not admitted(pods["router"], own_ns, ucx_lo),
              "%s: router admitted to %s UCX ports" % (tag, k))
        if k == "prefill":
            boot = container_port(c, "bootstrap")
            check(admitted(pods["decode"], own_ns, boot), "%s: decode cannot reach bootstrap" % tag)
            for who, labels in (("router", pods["router"]), ("prefill", pods["prefill"]),
                                ("stranger", stranger)):
                check(not admitted(labels, own_ns, boot),
                      "%s: bootstrap port open to %s" % (tag, who))
                check(not admitted(labels, scraper_ns or own_ns, boot) or who == "decode",
                      "%s: bootstrap port open to %s in the metrics namespace" % (tag, who))


def check_pdbs(tag, values, objs, all_pods):
    pdbs = by_kind(objs, "PodDisruptionBudget")
    for k in ("router", "prefill", "decode"):
        mine = [p for p in pdbs if selects(p["spec"]["selector"], all_pods[k])]
        want = 1 if values[k]["pdb"]["enabled"] else 0
        check(len(mine) == want, "%s: %d PDBs select %s pods" % (tag, len(mine), k))
        for p in mine:
            others = [o for o in all_pods if o != k and selects(p["spec"]["selector"], all_pods[o])]
            check(not others, "%s: PDB %s also selects %s" % (tag, p["metadata"]["name"], others))


def check_monitors(tag, values, objs, all_pods):
    pm, sm = by_kind(objs, "PodMonitor"), by_kind(objs, "ServiceMonitor")
    check(len(pm) == int(values["monitoring"]["podMonitor"]["enabled"]),
          "%s: %d PodMonitors" % (tag, len(pm)))
    check(len(sm) == int(values["monitoring"]["serviceMonitor"]["enabled"]),
          "%s: %d ServiceMonitors" % (tag, len(sm)))
    for p in pm:
        for k, labels in all_pods.items():
            check(selects(p["spec"]["selector"], labels),
                  "%s: PodMonitor selection of %s pods is wrong" % (tag, k))
        ep = p["spec"]["podMetricsEndpoints"]
        check(ep and ep[0]["port"] == "http" and ep[0]["path"] == "/metrics",
              "%s: PodMonitor endpoint %s" % (tag, ep))
    for s in sm:
        svcs = [v for v in by_kind(objs, "Service") if selects(s["spec"]["selector"],
                                                                v["metadata"]["labels"])]
        check(sorted(component(v) for v in svcs) == ["decode", "prefill", "router"],
              "%s: ServiceMonitor selects Services %s" % (tag, [v["metadata"]["name"] for v in svcs]))
        ep = s["spec"]["endpoints"]
        check(ep and ep[0]["port"] == "http" and ep[0]["path"] == "/metrics",
              "%s: ServiceMonitor endpoint %s" % (tag, ep))


DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "pdserve.json")


def check_dashboard(tag, values, objs):
    """grafana.dashboard.enabled: one ConfigMap with the sidecar's labels whose pdserve.json is
    deploy/grafana/pdserve.json byte for byte; off: none."""
    g = values["grafana"]["dashboard"]
    cms = [o for o in by_kind(objs, "ConfigMap") if "pdserve.json" in (o.get("data") or {})]
    if not g["enabled"]:
        check(not cms, "%s: a dashboard ConfigMap rendered while grafana.dashboard is off" % tag)
        return
    if not check(len(cms) == 1, "%s: %d dashboard ConfigMaps" % (tag, len(cms))):
        return
    cm = cms[0]
    meta = cm["metadata"]
    for k, v in g["labels"].items():
        check(meta["labels"].get(k) == v, "%s: dashboard ConfigMap label %s=%r, want %r"
              % (tag, k, meta["labels"].get(k), v))
    check(meta["labels"].get("app.kubernetes.io/instance") == RELEASE,
          "%s: dashboard ConfigMap lacks the chart's labels: %s" % (tag, meta["labels"]))
    check((meta.get("annotations") or {}) == g["annotations"],
          "%s: dashboard ConfigMap annotations %s" % (tag, meta.get("annotations")))
    check(meta.get("namespace") == (g["namespace"] or None),
          "%s: dashboard ConfigMap namespace %s" % (tag, meta.get("namespace")))
    with open(DASHBOARD) as f:
        want = f.read()
    got = cm["data"]["pdserve.json"]
    check(got == want, "%s: the ConfigMap's pdserve.json differs from deploy/grafana/pdserve.json "
          "(%d vs %d bytes)" % (tag, len(got), len(want)))
    check(json.loads(got).get("uid") == "pdserve", "%s: the ConfigMap's dashboard is not JSON "
          "with uid pdserve" % tag)


# ---- schema and tool checks ----

def k8s_validate(tag, objs):
    if kubernetes_validate is None:
        return
    for o in objs:
        what = "%s %s/%s" % (tag, o.get("kind"), o.get("metadata", {}).get("name"))
        if o.get("apiVersion", "").startswith("monitoring.coreos.com/"):
            continue  # CRDs: not in the Kubernetes schema; check_monitors covers them
        try:
            kubernetes_validate.validate(o, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            check(False, "%s: Kubernetes %s schema: %s at %s" % (
                what, KUBE_VERSION, e.message, "/".join(str(p) for p in e.path)))
        except Exception as e:  # noqa: BLE001 (unknown kind or version)
            check(False, "%s: kubernetes-validate: %s" % (what, e))


def yamllint(tag, text):
    yl = shutil.which("yamllint")
    if not yl:
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        p = subprocess.run([yl, "-f", "parsable", "-c", YAMLLINT_CONF, path],
                           capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(path)
    return p.returncode, p.stdout.replace(path, tag)


def tool_version(dist):
    try:
        from importlib import metadata
        return metadata.version(dist)
    except Exception:  # noqa: BLE001
        return "?"


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: test_chart.py BUILD_DIR [RENDERER]")
    build = sys.argv[1]
    r = Renderer(sys.argv[2] if len(sys.argv) > 2 else None)
    if not r.name:
        print("test_chart: SKIP: neither helm nor the Go renderer (pdserve-helm-render: needs "
              "golang-go and golang-github-masterminds-sprig-dev, scripts/setup.sh) is here")
        sys.exit(77)
    print("test_chart: renderer: %s" % r.name)
    print("test_chart: python %s, jsonschema %s, kubernetes-validate %s (Kubernetes %s), %s" % (
        sys.version.split()[0], tool_version("jsonschema"),
        tool_version("kubernetes-validate") if kubernetes_validate else "MISSING",
        KUBE_VERSION, shutil.which("yamllint") or "yamllint MISSING"))
    if kubernetes_validate is None:
        MISSING.append("kubernetes-validate (scripts/setup.sh installs it into .venv-tools/)")
    if not shutil.which("yamllint"):
        MISSING.append("yamllint (Debian package yamllint)")

    # the chart's own YAML files pass yamllint
    for f in ["Chart.yaml", "values.yaml"] + ["ci/" + x for x in os.listdir(os.path.join(CHART,
                                                                                          "ci"))]:
        lint = yamllint(f, open(os.path.join(CHART, f)).read())
        if lint:
            check(lint[0] == 0, "yamllint %s:\n%s" % (f, lint[1]))

    files = sorted(os.path.join(CHART, "ci", f) for f in os.listdir(os.path.join(CHART, "ci"))
                   if f.endswith(".yaml"))
    check(len(files) >= 5, "expected at least 5 values files in ci/, got %d" % len(files))
    for f in files:
        tag = os.path.basename(f)
        values = merged_values(f)
        errs = schema_errors(values)
        check(not errs, "%s: values do not match values.schema.json: %s" % (tag, errs))
        try:
            text, objs = r.objects([f])
        except RuntimeError as e:
            check(False, "%s: %s" % (tag, e))
            continue
        kinds = sorted(o["kind"] for o in objs)
        print("test_chart: %s: %d objects: %s" % (tag, len(objs), ", ".join(kinds)))
        k8s_validate(tag, objs)
        lint = yamllint(tag, text)
        if lint:
            check(lint[0] == 0, "%s: yamllint:\n%s" % (tag, lint[1]))
        check_wiring(tag, values, objs, build)
        check_dashboard(tag, values, objs)

    # helm lint (only where helm is installed)
    if r.helm:
        for f in files:
            p = subprocess.run([r.helm, "lint", "--strict", CHART, "-f", f], capture_output=True,
                               text=True, timeout=120)
            check(p.returncode == 0, "helm lint %s: %s" % (os.path.basename(f), p.stdout[-1000:]))

    # wrong type and typo: refused by the schema, naming the key
    bad = [({"prefill": {"replicas": "two"}}, "prefill.replicas"),
           ({"prefil": {"replicas": 2}}, "prefil"),
           ({"decode": {"httpPort": 70000}}, "decode.httpPort"),
           ({"engine": {"device": "tpu"}}, "engine.device")]
    for extra, key in bad:
        errs = schema_errors(merged_values(extra=extra))
        check(any(key in e for e in errs), "schema accepted %s (errors: %s)" % (extra, errs))
        print("test_chart: schema refuses %s: %s" % (json.dumps(extra), "; ".join(errs)))
        if r.helm:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as tf:
                yaml.safe_dump(extra, tf)
            rc, _, err = r.run([tf.name])
            os.unlink(tf.name)
            check(rc != 0 and key.split(".")[-1] in err,
                  "helm template accepted %s or did not name %s: %s" % (extra, key, err.strip()))

    # a grace period too short for preStop + drain fails the render, naming the key
    rc, _, err = r.run(sets=["decode.terminationGracePeriodSeconds=10"])
    check(rc != 0 and "decode.terminationGracePeriodSeconds" in err,
          "a 10 s decode grace period rendered (rc %d): %s" % (rc, err.strip()[:300]))
    # hostNetwork with equal worker ports fails the render, naming the keys
    rc, _, err = r.run(sets=["decode.hostNetwork=true"])
    check(rc != 0 and "decode.httpPort" in err,
          "hostNetwork with equal http ports rendered (rc %d): %s" % (rc, err.strip()[:300]))
    rc, _, err = r.run(sets=["decode.hostNetwork=true", "decode.httpPort=30001"])
    check(rc == 0, "hostNetwork with distinct ports did not render: %s" % err.strip()[:300])
    # model.source=pvc without a claim name fails the render, naming the key
    rc, _, err = r.run(sets=["model.pvc.claimName="])
    check(rc != 0 and "model.pvc.claimName" in err,
          "an empty model.pvc.claimName rendered (rc %d): %s" % (rc, err.strip()[:300]))

    # large integers stay integers in flags (Helm reads values as float64: printed bare, 2000000
    # would become 2e+06, which the daemons' flag parser refuses)
    _, objs = r.objects(sets=["engine.maxTotalTokens=2000000", "router.requestTimeoutSecs=1000000"])
    deps = {component(d): d["spec"]["template"]["spec"]["containers"][0]["args"]
            for d in by_kind(objs, "Deployment")}
    check(flag(deps["decode"], "--max-total-tokens") == "2000000" and
          flag(deps["router"], "--request-timeout-secs") == "1000000",
          "large integer flags rendered as %s / %s" % (flag(deps["decode"], "--max-total-tokens"),
                                                      flag(deps["router"], "--request-timeout-secs")))

    # the dashboard ConfigMap in the sidecar's namespace; a bad namespace refused by the schema
    sets = ["grafana.dashboard.enabled=true", "grafana.dashboard.namespace=monitoring"]
    values = merged_values(extra={"grafana": {"dashboard": {"enabled": True,
                                                            "namespace": "monitoring"}}})
    check(not schema_errors(values), "grafana.dashboard.namespace=monitoring refused: %s"
          % schema_errors(values))
    text, objs = r.objects(sets=sets)
    check_dashboard("--set %s" % " ".join(sets), values, objs)
    lint = yamllint("dashboard", text)
    if lint:
        check(lint[0] == 0, "dashboard render: yamllint:\n%s" % lint[1])
    errs = schema_errors(merged_values(extra={"grafana": {"dashboard": {"enabled": "yes"}}}))
    check(any("grafana.dashboard.enabled" in e for e in errs),
          "schema accepted grafana.dashboard.enabled: \"yes\" (%s)" % errs)

    # NOTES.txt renders and says how to reach the router (the Go renderer: --notes)
    if not r.helm:
        rc, out, err = r.run([os.path.join(CHART, "ci", "defaults-values.yaml")], notes=True)
        check(rc == 0 and "port-forward svc/%s-pdserve-router" % RELEASE in out and
              "/v1/chat/completions" in out and "Authorization: Bearer" in out,
              "NOTES.txt: rc %d %s" % (rc, err.strip()[:300]))

    # negative controls: the validators do fail on broken input
    if kubernetes_validate is not None:
        _, objs = r.objects([files[0]])
        dep = copy.deepcopy(by_kind(objs, "Deployment")[0])
        dep["spec"]["template"]["spec"]["containers"][0]["portz"] = []
        try:
            kubernetes_validate.validate(dep, KUBE_VERSION, strict=True)
            check(False, "kubernetes-validate accepted an unknown container field")
        except kubernetes_validate.ValidationError:
            pass
        dep = copy.deepcopy(by_kind(objs, "Deployment")[0])
        dep["spec"]["replicas"] = "two"
        try:
            kubernetes_validate.validate(dep, KUBE_VERSION, strict=True)
            check(False, "kubernetes-validate accepted replicas: \"two\"")
        except kubernetes_validate.ValidationError:
            pass
    lint = yamllint("bad.yaml", "a:\n   b: 1\n  c: 2\n")
    if lint:
        check(lint[0] != 0, "yamllint accepted a badly indented document")

    for n in sorted(NOTES):
        print("test_chart: NOTE: " + n)
    if FAILS:
        print("test_chart: %d failures" % len(FAILS))
        sys.exit(1)
    if MISSING:
        print("test_chart: all checks that could run passed; SKIP because missing: %s"
              % "; ".join(sorted(set(MISSING))))
        sys.exit(77)
    print("test_chart: PASS (%d values files, renderer: %s)" % (len(files), r.name))


if __name__ == "__main__":
    main()
