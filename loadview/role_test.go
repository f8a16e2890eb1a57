package loadview

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// Decode workers are a side of their own: never the worker step's
// candidates, found by DecodeWorkers, and the last healthy decode worker
// of a model is not ejected for an answer however many entry workers it
// has.
func TestRolesSplitTheFleet(t *testing.T) {
	r, _ := fleet(t, 0, Config{CBFailureThreshold: 1})
	ctx := context.Background()
	plain, _ := r.Add(ctx, "http://127.0.0.1:1", []string{"m"})
	p1, _ := r.AddRole(ctx, "http://127.0.0.2:1", []string{"m"}, Prefill)
	d1, _ := r.AddRole(ctx, "http://127.0.0.3:1", []string{"m"}, Decode)
	dAny, _ := r.AddRole(ctx, "http://127.0.0.4:1", nil, Decode)
	if _, err := r.AddRole(ctx, "http://127.0.0.2:1", nil, Decode); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("a URL under a second role: %v", err)
	}
	if got, _ := r.ForModel([]byte("m")); fmt.Sprint(got) != fmt.Sprint([]*Worker{plain[0], p1[0]}) {
		t.Fatalf("entry workers of m: %v", got)
	}
	if got, _ := r.ForModel(nil); len(got) != 2 {
		t.Fatalf("every entry worker: %v", got)
	}
	if got, _ := r.DecodeWorkers([]byte("m")); fmt.Sprint(got) != fmt.Sprint([]*Worker{d1[0], dAny[0]}) {
		t.Fatalf("decode workers of m: %v", got)
	}
	if got, ok := r.DecodeWorkers([]byte("other")); !ok || fmt.Sprint(got) != fmt.Sprint(dAny) {
		t.Fatalf("decode workers of an unlisted model: %v %v", got, ok)
	}
	if fmt.Sprint(r.Models()) != "[m]" || len(r.Workers()) != 4 {
		t.Fatalf("models %v, workers %d", r.Models(), len(r.Workers()))
	}
	if p1[0].Role() != Prefill || d1[0].Role().String() != "decode" || plain[0].Role().String() != "regular" {
		t.Fatal("roles")
	}
	for _, w := range r.Workers() {
		r.SetHealthy(w, true)
	}
	r.SetHealthy(dAny[0], false)
	r.RecordAnswerFailure(d1[0]) // the last healthy decode worker of m
	if !d1[0].Healthy() {
		t.Fatal("the last healthy decode worker was ejected for an answer")
	}
	r.RecordAnswerFailure(p1[0]) // plain serves m too
	if p1[0].Healthy() {
		t.Fatal("an entry worker with a healthy peer was not ejected")
	}
}

func TestParseRole(t *testing.T) {
	for _, s := range []string{"", "regular", "prefill", "decode"} {
		r, err := ParseRole(s)
		if err != nil || (s != "" && r.String() != s) {
			t.Errorf("ParseRole(%q) = %v, %v", s, r, err)
		}
	}
	if _, err := ParseRole("both"); err == nil {
		t.Error("ParseRole accepted an unknown role")
	}
}
