package upstream

import (
	"reflect"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// fasthttp passes the timeout of HostClient.DoTimeout/DoDeadline to the
// RoundTripper only through the unexported Request.timeout field (remaining
// time, updated by HostClient.Do before each attempt). Do and DoCanceler
// hand their exchanges the deadline themselves; for plain
// hc.DoTimeout calls on a HostClient using Transport the field is read here,
// located by reflection once and used only if it exists with the expected
// type. If a fasthttp upgrade removes it, plain hc.DoTimeout calls silently
// fall back to hc.ReadTimeout/WriteTimeout (TestPlainDoTimeout catches that).
var reqTimeoutOffset = func() uintptr {
	f, ok := reflect.TypeFor[fasthttp.Request]().FieldByName("timeout")
	if !ok || f.Type != reflect.TypeFor[time.Duration]() {
		return 0
	}
	return f.Offset
}()

func requestTimeout(req *fasthttp.Request) time.Duration {
	if reqTimeoutOffset == 0 {
		return 0
	}
	return *(*time.Duration)(unsafe.Add(unsafe.Pointer(req), reqTimeoutOffset))
}
