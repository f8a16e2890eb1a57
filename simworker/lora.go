package simworker

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Runtime LoRA adapters, as vLLM serves them with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING (docs/design.md §6, §8.4):
//
//	POST /v1/load_lora_adapter   {"lora_name": "x", "lora_path": "/p"}  200 text; 400 invalid or already loaded
//	POST /v1/unload_lora_adapter {"lora_name": "x"}                     200 text; 400 invalid; 404 unknown
//
// A loaded adapter is listed by /v1/models with root = its path and parent =
// the base model (the first served model), and is served under its own name.
// Its requests count in the base model's metrics (vLLM labels them with the
// served model name) but have their own prefix-cache namespace (vLLM keys
// LoRA blocks by adapter). The simulator loads nothing: any path is accepted.

// Bounds of the adapter table: a hostile client cannot grow it past
// Config.MaxAdapters entries of these sizes.
const (
	maxAdapterName = 256
	maxAdapterPath = 4096
)

// adapter is one loaded LoRA adapter.
type adapter struct {
	name, path, parent string
	created            int64
	ms                 *modelStats // the parent's
	salt               uint64      // the adapter's prefix-cache namespace
	id                 int         // vLLM's lora_int_id: 1, 2, … in load order (KV events' lora_id)
}

// adapters is a worker's table of loaded adapters, in load order.
type adapters struct {
	mu     sync.RWMutex
	byName map[string]*adapter
	order  []*adapter
	loaded int // adapters ever loaded: the last id given
}

func (a *adapters) get(name string) *adapter {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.byName[name]
}

func (a *adapters) list() []*adapter {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return append([]*adapter(nil), a.order...)
}

// target is a resolved model name: what a job needs of it.
type target struct {
	name string
	ms   *modelStats // whose metrics the request counts in
	salt uint64      // prefix-cache namespace
	lora *adapter    // nil for a base model
}

// resolve looks name up among the base models, then the loaded adapters.
func (w *Worker) resolve(name string) (target, bool) {
	if ms, ok := w.models[name]; ok {
		return target{name: name, ms: ms, salt: ms.salt}, true
	}
	if a := w.lora.get(name); a != nil {
		return target{name: name, ms: a.ms, salt: a.salt, lora: a}, true
	}
	return target{}, false
}

// LoadAdapter loads a LoRA adapter named name from path, as
// POST /v1/load_lora_adapter does; the error text is what the endpoint
// answers with 400.
func (w *Worker) LoadAdapter(name, path string) error {
	switch {
	case name == "" || path == "":
		return adapterError("Both 'lora_name' and 'lora_path' must be provided.")
	case len(name) > maxAdapterName || len(path) > maxAdapterPath:
		return adapterError("'lora_name' or 'lora_path' is too long.")
	}
	if _, ok := w.models[name]; ok {
		return adapterError("The lora adapter '" + name + "' has the name of a base model.")
	}
	parent := w.cfg.Models[0]
	a := &adapter{
		name: name, path: path, parent: parent, created: time.Now().Unix(),
		ms: w.models[parent], salt: maphash.String(hashSeed, "\x00lora\x00"+name),
	}
	l := &w.lora
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byName[name] != nil {
		return adapterError("The lora adapter '" + name + "' has already been loaded.")
	}
	if len(l.order) >= w.cfg.MaxAdapters {
		return adapterError("The lora adapter '" + name + "' cannot be loaded: the worker holds its maximum of adapters.")
	}
	if l.byName == nil {
		l.byName = map[string]*adapter{}
	}
	l.loaded++
	a.id = l.loaded
	l.byName[name] = a
	l.order = append(l.order, a)
	return nil
}

// UnloadAdapter removes the adapter named name and reports whether it was
// loaded. Requests already admitted finish.
func (w *Worker) UnloadAdapter(name string) bool {
	l := &w.lora
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byName[name] == nil {
		return false
	}
	delete(l.byName, name)
	for i, a := range l.order {
		if a.name == name {
			l.order = append(l.order[:i:i], l.order[i+1:]...)
			break
		}
	}
	return true
}

// Adapters returns the names of the loaded adapters, in load order.
func (w *Worker) Adapters() []string {
	var names []string
	for _, a := range w.lora.list() {
		names = append(names, a.name)
	}
	return names
}

type adapterError string

func (e adapterError) Error() string { return string(e) }

type loraRequest struct {
	Name string `json:"lora_name"`
	Path string `json:"lora_path"`
}

func (w *Worker) loadLoRA(ctx *fasthttp.RequestCtx) {
	var req loraRequest
	if err := api.Unmarshal(ctx.PostBody(), &req); err != nil {
		w.loraFail(ctx, fasthttp.StatusBadRequest, "InvalidUserInput", "malformed JSON body: "+err.Error())
		return
	}
	if err := w.LoadAdapter(req.Name, req.Path); err != nil {
		w.loraFail(ctx, fasthttp.StatusBadRequest, "InvalidUserInput", err.Error())
		return
	}
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString("Success: LoRA adapter '" + req.Name + "' added successfully.")
}

func (w *Worker) unloadLoRA(ctx *fasthttp.RequestCtx) {
	var req loraRequest
	if err := api.Unmarshal(ctx.PostBody(), &req); err != nil {
		w.loraFail(ctx, fasthttp.StatusBadRequest, "InvalidUserInput", "malformed JSON body: "+err.Error())
		return
	}
	if req.Name == "" {
		w.loraFail(ctx, fasthttp.StatusBadRequest, "InvalidUserInput", "either 'lora_name' and 'lora_int_id' needs to be provided.")
		return
	}
	if !w.UnloadAdapter(req.Name) {
		w.loraFail(ctx, fasthttp.StatusNotFound, "NotFoundError", "The lora adapter '"+req.Name+"' cannot be found.")
		return
	}
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString("Success: LoRA adapter '" + req.Name + "' removed successfully.")
}

// loraError is vLLM's error body on the adapter endpoints: the HTTP status
// as a number in code.
type loraError struct {
	Error loraErrorBody `json:"error"`
}

type loraErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func (w *Worker) loraFail(ctx *fasthttp.RequestCtx, status int, typ, msg string) {
	w.errs.Add(1)
	w.writeJSON(ctx, status, &loraError{Error: loraErrorBody{Message: msg, Type: typ, Code: status}})
}
