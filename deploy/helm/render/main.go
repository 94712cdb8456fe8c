// pdserve-helm-render renders a Helm chart the way `helm template` does, for machines without
// helm (CI, chart tests): Go's text/template with the Sprig v3 functions (the engine and the
// function library Helm uses) plus what Helm itself adds and the pdserve chart uses.
//
// Implemented, as in Helm 3: .Values = values.yaml, then each -f file, then each --set, merged
// deeply (a null value deletes the key); numbers are float64 (Helm reads values through JSON);
// .Release (Name, Namespace, Service "Helm", IsInstall, IsUpgrade, Revision), .Chart (from
// Chart.yaml, Helm's field names), .Capabilities (KubeVersion, APIVersions.Has), .Template;
// include, tpl, required, toYaml, fromYaml, toJson, fromJson, lookup (always empty, as in
// `helm template`); the Sprig functions Helm keeps (env and expandenv removed); every template
// of templates/ parsed into one set so _helpers.tpl defines are shared; files starting with "_"
// render nothing; "<no value>" printed as "" (missingkey=zero); NOTES.txt only with --notes;
// .Files.Get (the chart's other files, links followed; "" for a missing one, for templates/,
// Chart.yaml, values.yaml and values.schema.json, as Helm keeps those out of .Files).
// Not implemented: subcharts, the other .Files methods, schema validation (the tests run the
// chart's values.schema.json through python3-jsonschema), hooks, --set-string/--set-file.
//
// Build (Debian packages golang-go, golang-github-masterminds-sprig-dev, golang-gopkg-yaml.v3-dev,
// nothing downloaded):
//
//	GOPATH=/usr/share/gocode GO111MODULE=off go build -o pdserve-helm-render ./deploy/helm/render
//
// Usage: pdserve-helm-render [--name R] [--namespace NS] [-f values.yaml]... [--set a.b=v]...
//
//	[--notes] CHART_DIR
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"gopkg.in/yaml.v3"
)

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

type options struct {
	name, namespace, chart string
	valueFiles, sets       stringList
	notes                  bool
}

func die(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "pdserve-helm-render: "+format+"\n", a...)
	os.Exit(1)
}

// parseArgs reads helm template's argument shape: flags anywhere, one chart directory.
func parseArgs(args []string) (options, error) {
	o := options{name: "release-name", namespace: "default"}
	for i := 0; i < len(args); i++ {
		a := args[i]
		val := func() (string, error) {
			if eq := strings.IndexByte(a, '='); eq >= 0 && strings.HasPrefix(a, "--") {
				return a[eq+1:], nil
			}
			if i+1 >= len(args) {
				return "", fmt.Errorf("%s needs a value", a)
			}
			i++
			return args[i], nil
		}
		flag := a
		if eq := strings.IndexByte(a, '='); eq >= 0 && strings.HasPrefix(a, "--") {
			flag = a[:eq]
		}
		var err error
		var v string
		switch flag {
		case "--name":
			o.name, err = val()
		case "-n", "--namespace":
			o.namespace, err = val()
		case "-f", "--values":
			v, err = val()
			o.valueFiles = append(o.valueFiles, v)
		case "--set":
			v, err = val()
			o.sets = append(o.sets, v)
		case "--notes":
			o.notes = true
		case "-h", "--help":
			fmt.Println("usage: pdserve-helm-render [--name R] [--namespace NS] [-f values.yaml]... " +
				"[--set a.b=v]... [--notes] CHART_DIR")
			os.Exit(0)
		default:
			if strings.HasPrefix(a, "-") {
				return o, fmt.Errorf("unknown flag %s", a)
			}
			if o.chart != "" {
				return o, fmt.Errorf("one chart directory expected, got %s and %s", o.chart, a)
			}
			o.chart = a
		}
		if err != nil {
			return o, err
		}
	}
	if o.chart == "" {
		return o, errors.New("no chart directory given")
	}
	return o, nil
}

// jsonify converts YAML-decoded data to what Helm's values are: the result of json.Unmarshal
// (maps of string keys, []interface{}, float64 numbers).
func jsonify(v interface{}) (interface{}, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out interface{}
	err = json.Unmarshal(b, &out)
	return out, err
}

func readYAMLMap(path string) (map[string]interface{}, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var raw interface{}
	if err := yaml.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if raw == nil {
		return map[string]interface{}{}, nil
	}
	v, err := jsonify(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	m, ok := v.(map[string]interface{})
	if !ok {
		return nil, fmt.Errorf("%s: the top level is not a mapping", path)
	}
	return m, nil
}

// merge lays src over dst as Helm does: maps merge key by key, anything else replaces, and a
// null in src deletes the key.
func merge(dst, src map[string]interface{}) {
	for k, sv := range src {
		if sv == nil {
			delete(dst, k)
			continue
		}
		sm, sIsMap := sv.(map[string]interface{})
		dm, dIsMap := dst[k].(map[string]interface{})
		if sIsMap && dIsMap {
			merge(dm, sm)
		} else {
			dst[k] = sv
		}
	}
}

// setValue applies one --set a.b.c=v: v is read as YAML scalar types Helm's strvals gives
// (int, bool, null, else string).
func setValue(values map[string]interface{}, expr string) error {
	eq := strings.IndexByte(expr, '=')
	if eq <= 0 {
		return fmt.Errorf("--set %q: expected key=value", expr)
	}
	keys := strings.Split(expr[:eq], ".")
	raw := expr[eq+1:]
	var v interface{} = raw
	if n, err := strconv.ParseInt(raw, 10, 64); err == nil {
		v = float64(n)
	} else if raw == "true" || raw == "false" {
		v = raw == "true"
	} else if raw == "null" {
		v = nil
	}
	m := values
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]interface{})
		if !ok {
			next = map[string]interface{}{}
			m[k] = next
		}
		m = next
	}
	last := keys[len(keys)-1]
	if v == nil {
		delete(m, last)
	} else {
		m[last] = v
	}
	return nil
}

// toYAML is Helm's toYaml: block style, no trailing newline.
func toYAML(v interface{}) string {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return ""
	}
	enc.Close()
	return strings.TrimSuffix(buf.String(), "\n")
}

// fromYAML is Helm's fromYaml: a map, or {"Error": msg} when the text does not parse.
func fromYAML(s string) map[string]interface{} {
	var raw interface{}
	if err := yaml.Unmarshal([]byte(s), &raw); err != nil {
		return map[string]interface{}{"Error": err.Error()}
	}
	v, err := jsonify(raw)
	if err != nil {
		return map[string]interface{}{"Error": err.Error()}
	}
	m, _ := v.(map[string]interface{})
	if m == nil {
		m = map[string]interface{}{}
	}
	return m
}

func fromJSON(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

// versionSet is .Capabilities.APIVersions: the API groups of a recent Kubernetes, plus the
// Prometheus Operator's, as `helm template` without --api-versions would not have them.
type versionSet []string

func (v versionSet) Has(s string) bool {
	for _, x := range v {
		if x == s {
			return true
		}
	}
	return false
}

// chartFiles is .Files: Get reads a file of the chart by its path relative to the chart.
type chartFiles struct{ dir string }

func (f chartFiles) Get(name string) string {
	rel := filepath.Clean(filepath.FromSlash(name))
	if filepath.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return ""
	}
	first := strings.SplitN(filepath.ToSlash(rel), "/", 2)[0]
	switch first {
	case "templates", "charts", "Chart.yaml", "values.yaml", "values.schema.json":
		return ""
	}
	b, err := os.ReadFile(filepath.Join(f.dir, rel))
	if err != nil {
		return ""
	}
	return string(b)
}

type kubeVersion struct{ Version, Major, Minor, GitVersion string }

func (k kubeVersion) String() string { return k.Version }

func chartObject(dir string) (map[string]interface{}, error) {
	m, err := readYAMLMap(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, err
	}
	// Helm's chart.Metadata field names, from Chart.yaml's lowerCamel keys
	out := map[string]interface{}{}
	for k, v := range m {
		if k == "apiVersion" {
			out["APIVersion"] = v
			continue
		}
		out[strings.ToUpper(k[:1])+k[1:]] = v
	}
	for _, k := range []string{"Name", "Version", "AppVersion", "Description", "KubeVersion"} {
		if _, ok := out[k]; !ok {
			out[k] = ""
		}
	}
	return out, nil
}

func main() {
	o, err := parseArgs(os.Args[1:])
	if err != nil {
		die("%v", err)
	}
	chart, err := chartObject(o.chart)
	if err != nil {
		die("%v", err)
	}
	values, err := readYAMLMap(filepath.Join(o.chart, "values.yaml"))
	if err != nil {
		die("%v", err)
	}
	for _, f := range o.valueFiles {
		m, err := readYAMLMap(f)
		if err != nil {
			die("%v", err)
		}
		merge(values, m)
	}
	for _, s := range o.sets {
		if err := setValue(values, s); err != nil {
			die("%v", err)
		}
	}

	tdir := filepath.Join(o.chart, "templates")
	entries, err := os.ReadDir(tdir)
	if err != nil {
		die("%v", err)
	}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if !e.IsDir() && (strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml") ||
			strings.HasSuffix(n, ".tpl") || n == "NOTES.txt") {
			names = append(names, n)
		}
	}
	sort.Strings(names)

	chartName, _ := chart["Name"].(string)
	root := template.New("chart")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = fromYAML
	funcs["toJson"] = func(v interface{}) string { b, _ := json.Marshal(v); return string(b) }
	funcs["fromJson"] = fromJSON
	funcs["lookup"] = func(apiVersion, kind, ns, name string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	funcs["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil {
			return nil, errors.New(msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return nil, errors.New(msg)
		}
		return v, nil
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		err := root.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := root.Clone()
		if err != nil {
			return "", err
		}
		t, err = t.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		err = t.Execute(&buf, data)
		return strings.ReplaceAll(buf.String(), "<no value>", ""), err
	}
	root.Funcs(funcs).Option("missingkey=zero")
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(tdir, n))
		if err != nil {
			die("%v", err)
		}
		if _, err := root.New(chartName + "/templates/" + n).Parse(string(b)); err != nil {
			die("parse error: %v", err)
		}
	}

	apis := versionSet{"v1", "apps/v1", "batch/v1", "policy/v1", "networking.k8s.io/v1",
		"autoscaling/v2", "monitoring.coreos.com/v1", "monitoring.coreos.com/v1/PodMonitor",
		"monitoring.coreos.com/v1/ServiceMonitor"}
	data := map[string]interface{}{
		"Values": values,
		"Chart":  chart,
		"Files":  chartFiles{o.chart},
		"Release": map[string]interface{}{"Name": o.name, "Namespace": o.namespace,
			"Service": "Helm", "IsInstall": true, "IsUpgrade": false, "Revision": 1},
		"Capabilities": map[string]interface{}{
			"KubeVersion": kubeVersion{"v1.31.0", "1", "31", "v1.31.0"},
			"APIVersions": apis,
		},
	}

	var out bytes.Buffer
	for _, n := range names {
		if strings.HasPrefix(n, "_") || (n == "NOTES.txt" && !o.notes) {
			continue
		}
		full := chartName + "/templates/" + n
		data["Template"] = map[string]interface{}{"Name": full,
			"BasePath": chartName + "/templates"}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, full, data); err != nil {
			die("render error: %v", err)
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if n == "NOTES.txt" {
			fmt.Fprintf(&out, "NOTES:\n%s\n", strings.TrimSpace(text))
			continue
		}
		// one document per "---", each under its source line, as helm template prints them
		for _, doc := range docSep.Split(text, -1) {
			if strings.TrimSpace(doc) != "" {
				fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", full, strings.Trim(doc, "\n"))
			}
		}
	}
	os.Stdout.Write(out.Bytes())
}
