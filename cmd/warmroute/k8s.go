package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/warmroute/warmroute/k8swatch"
	"github.com/warmroute/warmroute/loadview"
)

// sdFlags are the flags that mean something only with --service-discovery.
var sdFlags = map[string]bool{
	"selector": true, "prefill-selector": true, "decode-selector": true,
	"service-discovery-namespace": true, "service-discovery-port": true, "kubeconfig": true,
}

// k8sSelectorOption is one selector flag, parsed, and the role of its pods.
type k8sSelectorOption struct {
	flag     string
	selector k8swatch.Selector
	role     loadview.Role
}

// namespaceName is a Kubernetes namespace (a DNS label).
var namespaceName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// checkDiscoveryFlags checks the Kubernetes discovery flags, each of which
// needs --service-discovery, and parses the selectors into o.sdSelectors:
// without --vllm-pd-disaggregation --selector is needed; with it, a
// selector of prefill or decode pods (or both); no two selectors alike.
// Whether both roles have a source is needWorkers'.
func checkDiscoveryFlags(o *options) error {
	if !o.serviceDiscovery {
		if len(o.sdFlagsGiven) > 0 {
			return fmt.Errorf("%s: only with --service-discovery", strings.Join(o.sdFlagsGiven, ", "))
		}
		return nil
	}
	if o.sdPort < 1 || o.sdPort > 65535 {
		return fmt.Errorf("--service-discovery-port %d: want 1-65535", o.sdPort)
	}
	if o.sdNamespace != "" && !namespaceName.MatchString(o.sdNamespace) {
		return fmt.Errorf("--service-discovery-namespace %q: not a namespace name", o.sdNamespace)
	}
	seen := map[string]string{}
	for _, s := range []struct {
		flag  string
		items []string
		role  loadview.Role
	}{{"--selector", o.selector, loadview.Regular}, {"--prefill-selector", o.prefillSelector, loadview.Prefill}, {"--decode-selector", o.decodeSelector, loadview.Decode}} {
		if len(s.items) == 0 {
			continue
		}
		sel, err := k8swatch.ParseSelector(s.items)
		if err != nil {
			return fmt.Errorf("%s: %w", s.flag, err)
		}
		if prev, dup := seen[sel.String()]; dup {
			return fmt.Errorf("%s and %s are the same selector %q: a worker has one role", prev, s.flag, sel.String())
		}
		seen[sel.String()] = s.flag
		o.sdSelectors = append(o.sdSelectors, k8sSelectorOption{s.flag, sel, s.role})
	}
	if len(o.sdSelectors) == 0 {
		if o.pd {
			return errors.New("--service-discovery: give --prefill-selector and --decode-selector (key=value...) with --vllm-pd-disaggregation")
		}
		return errors.New("--service-discovery: give --selector key=value...: an empty selector would take every pod")
	}
	return nil
}

// k8sFirstSync bounds the wait, before the router listens, for the first
// list of every selector.
const k8sFirstSync = 10 * time.Second

// startK8sDiscovery starts, until bg ends, the Kubernetes discovery of
// --service-discovery, having waited up to k8sFirstSync (or ctx) for its
// first list; missing credentials are an error.
func startK8sDiscovery(ctx, bg context.Context, o *options, reg *loadview.Registry, log *slog.Logger) error {
	c, err := k8swatch.Load(o.kubeconfig)
	if err != nil {
		return fmt.Errorf("--service-discovery: %w", err)
	}
	var d *loadview.K8sDiscovery
	cfg := loadview.K8sConfig{Port: o.sdPort}
	var sels []string
	for _, s := range o.sdSelectors {
		w, err := k8swatch.New(c, k8swatch.Config{
			Namespace:   o.sdNamespace,
			Selector:    s.selector,
			Annotations: []string{loadview.BootstrapPortAnnotation},
			MaxPods:     max(4096, 2*o.maxWorkers),
			OnChange:    func() { d.Notify() },
			Logger:      log,
		})
		if err != nil {
			return fmt.Errorf("%s: %w", s.flag, err)
		}
		cfg.Sources = append(cfg.Sources, loadview.K8sSource{Watcher: w, Role: s.role})
		sels = append(sels, s.role.String()+": "+s.selector.String())
	}
	if d, err = loadview.NewK8sDiscovery(reg, cfg); err != nil {
		return err
	}
	log.Info("Kubernetes discovery (--service-discovery)", "server", c.Server(), "namespace", cmp.Or(o.sdNamespace, "(all)"),
		"selectors", strings.Join(sels, "; "), "port", o.sdPort)
	go d.Run(bg)
	if !d.WaitFirstSync(ctx, k8sFirstSync) {
		log.Warn("--service-discovery: no first pod list yet; starting, the workers join as the list arrives")
	}
	return nil
}
