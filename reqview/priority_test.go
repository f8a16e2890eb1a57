package reqview

import (
	"encoding/json"
	"testing"
)

func TestPriority(t *testing.T) {
	f := func(body string, want int, strippable bool, without string) {
		t.Helper()
		for _, parse := range []func(*View, []byte) error{
			func(v *View, b []byte) error { return Parse(v, b, Chat) },
			ParseModel,
		} {
			var v View
			if err := parse(&v, []byte(body)); err != nil {
				t.Fatalf("%s: %v", body, err)
			}
			if v.Priority != want || (v.PriorityStart >= 0) != strippable {
				t.Fatalf("%s: priority %d span %d-%d, want %d strippable %v", body, v.Priority, v.PriorityStart, v.PriorityEnd, want, strippable)
			}
			if !strippable {
				continue
			}
			got := string(v.WithoutPriority(nil, []byte(body)))
			if got != without || !json.Valid([]byte(got)) {
				t.Fatalf("%s without priority: %s, want %s", body, got, without)
			}
		}
	}
	f(`{"model":"m","messages":[]}`, 0, false, "")
	f(`{"model":"m","priority":5,"messages":[]}`, 5, true, `{"model":"m","messages":[]}`)
	f(`{"priority": -3 , "model":"m"}`, -3, true, `{ "model":"m"}`)
	f(`{"model":"m",  "priority" :10}`, 10, true, `{"model":"m"}`)
	f(`{"priority":7}`, 7, true, `{}`)
	f(`{"model":"m","priority":99999999999999}`, MaxPriority, true, `{"model":"m"}`)
	f(`{"model":"m","priority":1.5}`, 0, false, "")    // not an integer: forwarded as sent
	f(`{"model":"m","priority":"1"}`, 0, false, "")    // a string: forwarded as sent
	f(`{"model":"m","\u0070riority":2}`, 2, false, "") // escaped key: read, not removed
}

func FuzzWithoutPriority(f *testing.F) {
	f.Add([]byte(`{"model":"m","priority":5,"messages":[]}`))
	f.Add([]byte(`{ "priority" : -1 }`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var v View
		if ParseModel(&v, body) != nil || v.PriorityStart < 0 {
			return
		}
		out := v.WithoutPriority(nil, body)
		var m map[string]any
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("%q → %q: %v", body, out, err)
		}
		if _, ok := m["priority"]; ok && len(out) == len(body) {
			t.Fatalf("%q: priority not removed", body)
		}
	})
}
