package loadview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// A reload swaps the allow-list whole (a bad entry changes nothing), the
// bearer token of the registry's own calls, and the models of a worker the
// config fixed.
func TestReloadAllowListKeyAndModels(t *testing.T) {
	r := NewRegistry(Config{AllowedWorkers: []string{"10.0.0.0/8"}, APIKey: "old", Logger: quiet()})
	if err := r.Admit("http://192.168.1.1:8000"); !errors.Is(err, ErrNotAllowed) {
		t.Fatalf("before: %v", err)
	}
	if err := r.SetAllowedWorkers([]string{"192.168.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Admit("http://192.168.1.1:8000"); err != nil {
		t.Fatalf("after the swap: %v", err)
	}
	if err := r.Admit("http://10.1.1.1:8000"); !errors.Is(err, ErrNotAllowed) {
		t.Fatalf("the old list still admits: %v", err)
	}
	if err := r.SetAllowedWorkers([]string{"10.0.0.0/8", "bad_host!"}); err == nil {
		t.Fatal("a bad entry was accepted")
	}
	if err := r.Admit("http://192.168.1.1:8000"); err != nil {
		t.Fatalf("a rejected list changed the allow-list: %v", err)
	}

	var auth atomic.Value
	auth.Store("")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/v1/models" {
			auth.Store(req.Header.Get("Authorization"))
			io.WriteString(w, `{"object":"list","data":[{"id":"m"}]}`) //nolint:errcheck
		}
	}))
	defer srv.Close()
	r.SetAPIKey("new")
	ws, err := r.Add(context.Background(), srv.URL, nil)
	if err != nil || auth.Load() != "Bearer new" {
		t.Fatalf("discovery sent %q (%v), want the new key", auth.Load(), err)
	}
	if r.SetModels(srv.URL, []string{"x"}) {
		t.Fatal("SetModels changed a worker whose models are discovered")
	}
	r.Remove(srv.URL)
	ws, err = r.Add(context.Background(), srv.URL, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	if !r.SetModels(srv.URL, []string{"a", "b"}) || fmt.Sprint(ws[0].Models()) != "[a b]" {
		t.Fatalf("models %v after SetModels", ws[0].Models())
	}
	if got, ok := r.ForModel([]byte("b")); !ok || len(got) != 1 {
		t.Fatal("the snapshot does not route the added model")
	}
}
