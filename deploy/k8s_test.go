package deploy

import (
	"bytes"
	"cmp"
	"errors"
	"io"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/warmroute/warmroute/internal/testwait"
)

// object is the part of a Kubernetes object the invariants read.
type object struct {
	Kind     string
	Metadata struct {
		Name        string
		Annotations map[string]string
	}
	Spec struct {
		Replicas    *int
		ClusterIP   string         `yaml:"clusterIP"`
		ServiceName string         `yaml:"serviceName"`
		Selector    map[string]any // a Service's labels, or a workload's matchLabels
		Ports       []servicePort
		Template    struct {
			Metadata struct {
				Labels      map[string]string
				Annotations map[string]string
			}
			Spec podSpec
		}
	}
	StringData map[string]string `yaml:"stringData"`

	// RBAC: a Role's rules, a RoleBinding's subjects and role; a
	// ServiceAccount's token mount.
	Rules []struct {
		APIGroups        []string `yaml:"apiGroups"`
		Resources, Verbs []string
	}
	Subjects []struct{ Kind, Name, Namespace string }
	RoleRef  struct {
		APIGroup   string `yaml:"apiGroup"`
		Kind, Name string
	} `yaml:"roleRef"`
	AutomountServiceAccountToken *bool `yaml:"automountServiceAccountToken"`
}

type servicePort struct {
	Name       string
	Port       int
	TargetPort string `yaml:"targetPort"`
}

type podSpec struct {
	ServiceAccountName           string           `yaml:"serviceAccountName"`
	AutomountServiceAccountToken *bool            `yaml:"automountServiceAccountToken"`
	SecurityContext              *securityContext `yaml:"securityContext"`
	Containers                   []container
	InitContainers               []container `yaml:"initContainers"`
}

type securityContext struct {
	RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
	RunAsUser                *int64 `yaml:"runAsUser"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	Capabilities             struct{ Drop []string }
}

type container struct {
	Name, Image   string
	Command, Args []string
	Env           []envVar
	Ports         []struct {
		Name          string
		ContainerPort int `yaml:"containerPort"`
	}
	ReadinessProbe  *probe `yaml:"readinessProbe"`
	LivenessProbe   *probe `yaml:"livenessProbe"`
	Resources       struct{ Requests, Limits map[string]string }
	SecurityContext *securityContext `yaml:"securityContext"`
}

type envVar struct {
	Name, Value string
	ValueFrom   *struct {
		SecretKeyRef *struct{ Name, Key string } `yaml:"secretKeyRef"`
		FieldRef     *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

type probe struct {
	HTTPGet *struct {
		Path string
		Port string
	} `yaml:"httpGet"`
	TCPSocket *struct{ Port string } `yaml:"tcpSocket"`
}

// port resolves a probe's or a Service's port (a name or a number) to one
// of c's container ports; 0 when none.
func (c *container) port(p string) int {
	for _, cp := range c.Ports {
		if cp.Name == p || strconv.Itoa(cp.ContainerPort) == p {
			return cp.ContainerPort
		}
	}
	return 0
}

// manifests reads every object of k8s/*.yaml.
func manifests(t *testing.T) []object {
	t.Helper()
	files, _ := filepath.Glob("k8s/*.yaml")
	if len(files) == 0 {
		t.Fatal("no k8s/*.yaml")
	}
	var objs []object
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o object
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.Kind == "" || o.Metadata.Name == "" {
				t.Fatalf("%s: an object without kind or name", f)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

func find(objs []object, kind, name string) *object {
	for i := range objs {
		if objs[i].Kind == kind && objs[i].Metadata.Name == name {
			return &objs[i]
		}
	}
	return nil
}

func isWorkload(o *object) bool {
	return o.Kind == "Deployment" || o.Kind == "StatefulSet" || o.Kind == "DaemonSet"
}

// selects reports whether Service s selects workload w's pods.
func selects(s, w *object) bool {
	if len(s.Spec.Selector) == 0 {
		return false
	}
	for k, v := range s.Spec.Selector {
		if w.Spec.Template.Metadata.Labels[k] != v {
			return false
		}
	}
	return true
}

// routerContainer is the warmroute container of the router Deployment.
func routerContainer(t *testing.T, objs []object) (*object, *container) {
	t.Helper()
	d := find(objs, "Deployment", "warmroute")
	if d == nil {
		t.Fatal("no Deployment warmroute")
	}
	for i := range d.Spec.Template.Spec.Containers {
		if c := &d.Spec.Template.Spec.Containers[i]; c.Name == "warmroute" {
			return d, c
		}
	}
	t.Fatal("Deployment warmroute has no container warmroute")
	return nil, nil
}

// flagValue is the value of --name in args (--name=v or --name v).
func flagValue(args []string, name string) string {
	for i, a := range args {
		a = "-" + strings.TrimLeft(a, "-")
		if v, ok := strings.CutPrefix(a, "-"+name+"="); ok {
			return v
		}
		if a == "-"+name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// TestManifests checks the invariants of k8s/: non-root containers on a
// read-only root with no capabilities; the router's args, env and ports are
// the binary's; its --worker-dns names a headless Service; the Services
// reach container ports; the Redis is durable and its Secret's URL reaches it.
func TestManifests(t *testing.T) {
	objs := manifests(t)
	for i := range objs {
		o := &objs[i]
		if !isWorkload(o) {
			continue
		}
		pod := o.Spec.Template.Spec
		for _, c := range append(slices.Clone(pod.Containers), pod.InitContainers...) {
			where := o.Kind + "/" + o.Metadata.Name + " container " + c.Name
			sc, psc := c.SecurityContext, pod.SecurityContext
			if sc == nil {
				t.Errorf("%s: no securityContext", where)
				continue
			}
			nonRoot, user := sc.RunAsNonRoot, sc.RunAsUser
			if psc != nil && nonRoot == nil {
				nonRoot = psc.RunAsNonRoot
			}
			if psc != nil && user == nil {
				user = psc.RunAsUser
			}
			switch {
			case nonRoot == nil || !*nonRoot:
				t.Errorf("%s: runAsNonRoot is not true", where)
			case user == nil || *user == 0:
				t.Errorf("%s: no numeric non-root runAsUser", where)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("%s: allowPrivilegeEscalation is not false", where)
			case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Errorf("%s: readOnlyRootFilesystem is not true", where)
			case !slices.Contains(sc.Capabilities.Drop, "ALL"):
				t.Errorf("%s: capabilities do not drop ALL", where)
			}
			if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
				t.Errorf("%s: want cpu and memory requests and a memory limit", where)
			}
			if len(c.Ports) > 0 && (c.ReadinessProbe == nil || c.LivenessProbe == nil) {
				t.Errorf("%s: serves ports without readiness and liveness probes", where)
			}
			for _, p := range []*probe{c.ReadinessProbe, c.LivenessProbe} {
				switch {
				case p == nil:
				case p.HTTPGet != nil && c.port(p.HTTPGet.Port) == 0, p.TCPSocket != nil && c.port(p.TCPSocket.Port) == 0:
					t.Errorf("%s: a probe on a port the container does not declare", where)
				}
			}
		}
	}

	d, rc := routerContainer(t, objs)
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("router replicas %v, want 2 or more", d.Spec.Replicas)
	}
	// The flags parse as the binary parses them: -h after them exits 0 only
	// when every flag before it exists and its value has the flag's type.
	if out, err := exec.Command(binary, append(slices.Clone(rc.Args), "-h")...).CombinedOutput(); err != nil {
		t.Errorf("warmroute %s: %v\n%s", strings.Join(rc.Args, " "), err, out)
	}
	help := helpText(t)
	for _, a := range rc.Args {
		if strings.HasPrefix(a, "-") {
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if !strings.Contains(help, "\n  -"+name+" ") && !strings.Contains(help, "\n  -"+name+"\n") {
				t.Errorf("router arg %s: no such flag in warmroute -h", a)
			}
		}
	}
	for _, e := range rc.Env {
		if strings.HasPrefix(e.Name, "WARMROUTE_") && !strings.Contains(help, "$"+e.Name) {
			t.Errorf("env %s: warmroute -h does not name it", e.Name)
		}
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			ref := e.ValueFrom.SecretKeyRef
			if s := find(objs, "Secret", ref.Name); s == nil || s.StringData[ref.Key] == "" {
				t.Errorf("env %s: no Secret %s with key %s", e.Name, ref.Name, ref.Key)
			}
		}
	}
	for _, flag := range []string{"port", "prometheus-port"} {
		if p := flagValue(rc.Args, flag); p == "" || rc.port(p) == 0 {
			t.Errorf("--%s %q is not a container port", flag, p)
		}
	}
	if a := d.Spec.Template.Metadata.Annotations; a["prometheus.io/port"] != flagValue(rc.Args, "prometheus-port") || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations %v do not match --prometheus-port", a)
	}

	// The workers' source: --worker-dns NAME:PORT names a headless Service
	// and one of its ports, or --service-discovery has its RBAC and its
	// selector picks the pods of the workers' Service.
	var ws *object
	if target := flagValue(rc.Args, "worker-dns"); target != "" {
		ws = checkWorkerDNS(t, objs, target)
	} else if slices.Contains(rc.Args, "--service-discovery") {
		ws = checkServiceDiscovery(t, objs, d, rc)
	} else {
		t.Fatal("the router has no source of workers: --worker-dns or --service-discovery")
	}

	// Every other Service selects a workload here and targets its ports.
	for i := range objs {
		s := &objs[i]
		if s.Kind != "Service" || ws != nil && s.Metadata.Name == ws.Metadata.Name {
			continue
		}
		var w *object
		for j := range objs {
			if isWorkload(&objs[j]) && selects(s, &objs[j]) {
				w = &objs[j]
			}
		}
		if w == nil {
			t.Errorf("Service %s selects no workload", s.Metadata.Name)
			continue
		}
		for _, p := range s.Spec.Ports {
			tp := cmp.Or(p.TargetPort, strconv.Itoa(p.Port))
			if !slices.ContainsFunc(w.Spec.Template.Spec.Containers, func(c container) bool { return c.port(tp) != 0 }) {
				t.Errorf("Service %s port %s: no container port %s in %s", s.Metadata.Name, p.Name, tp, w.Metadata.Name)
			}
		}
	}

	// The Redis: durable settings, and the Secret's URL reaches its Service.
	var redis *object
	for i := range objs {
		if objs[i].Kind == "StatefulSet" && slices.ContainsFunc(objs[i].Spec.Template.Spec.Containers, func(c container) bool {
			return slices.Contains(append(slices.Clone(c.Command), c.Args...), "redis-server")
		}) {
			redis = &objs[i]
		}
	}
	if redis == nil {
		t.Fatal("no Redis StatefulSet")
	}
	args := strings.Join(redis.Spec.Template.Spec.Containers[0].Args, " ")
	for _, want := range []string{"--appendonly yes", "--appendfsync always", "--maxmemory-policy noeviction"} {
		if !strings.Contains(args, want) {
			t.Errorf("Redis args %q lack %q", args, want)
		}
	}
	if hs := find(objs, "Service", redis.Spec.ServiceName); hs == nil || hs.Spec.ClusterIP != "None" || !selects(hs, redis) {
		t.Errorf("Redis StatefulSet serviceName %q: no headless Service selecting it", redis.Spec.ServiceName)
	}
	for _, e := range rc.Env {
		if e.Name != "WARMROUTE_REDIS_URL" {
			continue
		}
		sec := find(objs, "Secret", e.ValueFrom.SecretKeyRef.Name)
		u, err := url.Parse(sec.StringData[e.ValueFrom.SecretKeyRef.Key])
		if err != nil || u.Scheme != "redis" && u.Scheme != "rediss" {
			t.Fatalf("Secret %s: bad Redis URL (%v)", sec.Metadata.Name, err)
		}
		rs := find(objs, "Service", u.Hostname())
		if rs == nil || !selects(rs, redis) {
			t.Errorf("Redis URL host %s is not a Service of the Redis StatefulSet", u.Hostname())
		} else if !slices.ContainsFunc(rs.Spec.Ports, func(p servicePort) bool {
			return strconv.Itoa(p.Port) == u.Port()
		}) {
			t.Errorf("Redis URL port %s is not a port of Service %s", u.Port(), rs.Metadata.Name)
		}
		if pw, _ := u.User.Password(); pw != sec.StringData["password"] {
			t.Errorf("Secret %s: the URL's password is not the password key redis-server gets", sec.Metadata.Name)
		}
	}
}

// checkWorkerDNS: --worker-dns NAME:PORT names a headless Service and one
// of its ports; it returns that Service.
func checkWorkerDNS(t *testing.T, objs []object, target string) *object {
	t.Helper()
	name, port, _ := strings.Cut(target, ":")
	ws := find(objs, "Service", strings.Split(name, ".")[0])
	if ws == nil {
		t.Fatalf("--worker-dns %q: no Service %s", target, name)
	}
	if ws.Spec.ClusterIP != "None" {
		t.Errorf("Service %s: clusterIP %q, want None (headless: one record per worker pod)", ws.Metadata.Name, ws.Spec.ClusterIP)
	}
	if !slices.ContainsFunc(ws.Spec.Ports, func(p servicePort) bool {
		return strconv.Itoa(p.Port) == port
	}) {
		t.Errorf("--worker-dns %q: Service %s has no port %s", target, ws.Metadata.Name, port)
	}
	return ws
}

// checkServiceDiscovery: the router's pods run as a ServiceAccount with its
// token mounted, bound to a Role that may get, list and watch pods and
// nothing else; --service-discovery-namespace is the router's own
// namespace (where a Role holds) from the downward API; --selector picks
// the pods the workers' Service selects, at a port it targets. It returns
// that Service.
func checkServiceDiscovery(t *testing.T, objs []object, d *object, rc *container) *object {
	t.Helper()
	pod := d.Spec.Template.Spec
	sa := find(objs, "ServiceAccount", pod.ServiceAccountName)
	switch {
	case pod.ServiceAccountName == "" || sa == nil:
		t.Fatalf("--service-discovery: the router's serviceAccountName %q names no ServiceAccount here", pod.ServiceAccountName)
	case pod.AutomountServiceAccountToken != nil && !*pod.AutomountServiceAccountToken,
		pod.AutomountServiceAccountToken == nil && sa.AutomountServiceAccountToken != nil && !*sa.AutomountServiceAccountToken:
		t.Error("--service-discovery: the service account token is not mounted (automountServiceAccountToken false)")
	}
	granted := false
	for i := range objs {
		rb := &objs[i]
		if rb.Kind != "RoleBinding" || !slices.ContainsFunc(rb.Subjects, func(s struct{ Kind, Name, Namespace string }) bool {
			return s.Kind == "ServiceAccount" && s.Name == sa.Metadata.Name
		}) {
			continue
		}
		role := find(objs, rb.RoleRef.Kind, rb.RoleRef.Name)
		if rb.RoleRef.Kind != "Role" || rb.RoleRef.APIGroup != "rbac.authorization.k8s.io" || role == nil {
			t.Errorf("RoleBinding %s: roleRef %+v names no Role here", rb.Metadata.Name, rb.RoleRef)
			continue
		}
		for _, r := range role.Rules {
			if !slices.Equal(r.APIGroups, []string{""}) || !slices.Equal(r.Resources, []string{"pods"}) {
				t.Errorf("Role %s grants %v on %v: want pods of the core group only", role.Metadata.Name, r.Verbs, r.Resources)
				continue
			}
			v := slices.Sorted(slices.Values(r.Verbs))
			if !slices.Equal(v, []string{"get", "list", "watch"}) {
				t.Errorf("Role %s verbs %v: want get, list, watch and nothing more", role.Metadata.Name, r.Verbs)
				continue
			}
			granted = true
		}
	}
	if !granted {
		t.Errorf("no RoleBinding grants ServiceAccount %s get, list and watch on pods", sa.Metadata.Name)
	}
	ns := flagValue(rc.Args, "service-discovery-namespace")
	envName, ok := strings.CutPrefix(ns, "$(")
	envName = strings.TrimSuffix(envName, ")")
	if !ok || !slices.ContainsFunc(rc.Env, func(e envVar) bool {
		return e.Name == envName && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace"
	}) {
		t.Errorf("--service-discovery-namespace %q: want $(VAR) of an env VAR from metadata.namespace (a Role holds in its own namespace; empty would watch every namespace)", ns)
	}
	labels := map[string]any{}
	for _, a := range rc.Args {
		if v, ok := strings.CutPrefix(a, "--selector="); ok {
			for _, kv := range strings.Split(v, ",") {
				k, val, _ := strings.Cut(kv, "=")
				labels[k] = val
			}
		}
	}
	var ws *object
	for i := range objs {
		if s := &objs[i]; s.Kind == "Service" && len(s.Spec.Selector) > 0 && maps.Equal(s.Spec.Selector, labels) {
			ws = s
		}
	}
	if ws == nil {
		t.Fatalf("--selector %v: no Service here selects the same pods (the workers')", labels)
	}
	port := flagValue(rc.Args, "service-discovery-port")
	if !slices.ContainsFunc(ws.Spec.Ports, func(p servicePort) bool { return cmp.Or(p.TargetPort, strconv.Itoa(p.Port)) == port }) {
		t.Errorf("--service-discovery-port %q: not a port the workers' Service %s targets", port, ws.Metadata.Name)
	}
	return ws
}

// TestProbesAndScrapeOnRouter: the router Deployment's probe paths and its
// scrape path answer 200 on the ports the manifest points them at.
func TestProbesAndScrapeOnRouter(t *testing.T) {
	objs := manifests(t)
	d, rc := routerContainer(t, objs)
	r := startRouter(t)
	// A container port is the inference listener when --port names it, the
	// metrics listener when --prometheus-port does.
	addr := map[int]string{}
	for flag, a := range map[string]string{"port": r.api, "prometheus-port": r.metrics} {
		n, _ := strconv.Atoi(flagValue(rc.Args, flag))
		addr[n] = a
	}
	check := func(what string, port int, path string) {
		t.Helper()
		base, ok := addr[port]
		if !ok {
			t.Errorf("%s: port %d is neither --port nor --prometheus-port", what, port)
			return
		}
		testwait.Until(t, what+" "+path+" to answer 200", func() bool { return r.get(t, base+path) != "" })
	}
	for what, p := range map[string]*probe{"readiness": rc.ReadinessProbe, "liveness": rc.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("router %s probe: want httpGet", what)
			continue
		}
		check(what, rc.port(p.HTTPGet.Port), p.HTTPGet.Path)
	}
	a := d.Spec.Template.Metadata.Annotations
	n, _ := strconv.Atoi(a["prometheus.io/port"])
	check("scrape", n, a["prometheus.io/path"])
}

// TestDockerfile: a static, stripped build; a non-root final stage on a
// minimal base; the ports the router Deployment declares exposed; the
// entrypoint the binary the build stage wrote.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags "-s -w"`, "./cmd/warmroute"} {
		if !strings.Contains(text, want) {
			t.Errorf("Dockerfile: no %s", want)
		}
	}
	stages := regexp.MustCompile(`(?m)^FROM `).Split(text, -1)
	final := stages[len(stages)-1]
	base := strings.Fields(final)[0]
	if !strings.HasPrefix(base, "gcr.io/distroless/static") && base != "scratch" {
		t.Errorf("final base %s: want distroless static or scratch", base)
	}
	user := regexp.MustCompile(`(?m)^USER (\S+)`).FindStringSubmatch(final)
	if user == nil || strings.HasPrefix(user[1], "0") || strings.HasPrefix(user[1], "root") {
		t.Errorf("final stage USER %v: want a non-root user", user)
	}
	entry := regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)"`).FindStringSubmatch(final)
	if entry == nil || !regexp.MustCompile(`(?m)^COPY --from=\S+ \S+ `+regexp.QuoteMeta(entry[1])+`$`).MatchString(final) {
		t.Errorf("ENTRYPOINT %v is not the binary copied from the build stage", entry)
	}
	exposed := map[int]bool{}
	for _, m := range regexp.MustCompile(`(?m)^EXPOSE (.+)$`).FindAllStringSubmatch(final, -1) {
		for _, p := range strings.Fields(m[1]) {
			n, _ := strconv.Atoi(strings.TrimSuffix(p, "/tcp"))
			exposed[n] = true
		}
	}
	_, rc := routerContainer(t, manifests(t))
	for _, p := range rc.Ports {
		if !exposed[p.ContainerPort] {
			t.Errorf("container port %d (%s) not EXPOSEd", p.ContainerPort, p.Name)
		}
	}
}

// TestImageBuild builds the image with podman or buildah when
// WARMROUTE_IMAGE_BUILD is set: the base images come from registries, so it
// needs network access or both images in the local store.
func TestImageBuild(t *testing.T) {
	if os.Getenv("WARMROUTE_IMAGE_BUILD") == "" {
		t.Skip("set WARMROUTE_IMAGE_BUILD=1 to build the image (pulls golang and distroless base images)")
	}
	tool := ""
	for _, c := range []string{"podman", "buildah"} {
		if _, err := exec.LookPath(c); err == nil {
			tool = c
			break
		}
	}
	if tool == "" {
		t.Fatal("neither podman nor buildah on PATH")
	}
	args := []string{"build", "-f", "deploy/Dockerfile", "-t", "warmroute:test", "."}
	if tool == "buildah" {
		args[0] = "bud"
	}
	cmd := exec.Command(tool, args...)
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", tool, strings.Join(args, " "), err, out)
	}
}
