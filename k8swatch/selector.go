package k8swatch

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Selector is an equality label selector: every key=value must hold (the
// vLLM router's --selector key1=value1 key2=value2).
type Selector map[string]string

var (
	labelName  = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelValue = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)
	dnsSub     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// ParseSelector parses key=value items, each a Kubernetes label key
// ([prefix/]name) and value; a key given twice is an error.
func ParseSelector(items []string) (Selector, error) {
	s := Selector{}
	for _, it := range items {
		k, v, ok := strings.Cut(it, "=")
		if !ok || strings.HasPrefix(v, "=") {
			return nil, fmt.Errorf("selector %q: want key=value", it)
		}
		if !validKey(k) {
			return nil, fmt.Errorf("selector %q: invalid label key", it)
		}
		if !labelValue.MatchString(v) {
			return nil, fmt.Errorf("selector %q: invalid label value", it)
		}
		if _, dup := s[k]; dup {
			return nil, fmt.Errorf("selector: key %q given twice", k)
		}
		s[k] = v
	}
	return s, nil
}

func validKey(k string) bool {
	prefix, name, ok := strings.Cut(k, "/")
	if !ok {
		return labelName.MatchString(k)
	}
	return len(prefix) <= 253 && dnsSub.MatchString(prefix) && labelName.MatchString(name)
}

// String is the selector as the API's labelSelector parameter takes it,
// keys sorted: "k1=v1,k2=v2".
func (s Selector) String() string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + s[k]
	}
	return strings.Join(keys, ",")
}

// Matches reports whether labels satisfy every term of s.
func (s Selector) Matches(labels map[string]string) bool {
	for k, v := range s {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
