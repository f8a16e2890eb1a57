package sharedstate

import (
	"encoding/binary"
	"errors"
	"strconv"
)

// Kind names what a key holds; it is the kind segment of the key schema
// (docs/design.md §8.3, see doc.go).
type Kind byte

const (
	// KindBinding: session → worker URL, per model (sessionshard.Sessions).
	KindBinding Kind = 'b'
	// KindMemory: the model step's memory per (logical model, session)
	// (sessionshard.Memory), an opaque record (see MemoryRecord).
	KindMemory Kind = 'm'
	// KindToolCall: hard lock tool_call_id → model.
	KindToolCall Kind = 't'
	// KindResponse: hard lock previous_response_id → model and worker.
	KindResponse Kind = 'r'
	// KindReasoning: hard lock opaque reasoning artifact → model (and worker).
	KindReasoning Kind = 's'
)

func (k Kind) String() string {
	switch k {
	case KindBinding:
		return "binding"
	case KindMemory:
		return "memory"
	case KindToolCall:
		return "tool_call"
	case KindResponse:
		return "response"
	case KindReasoning:
		return "reasoning"
	}
	return "unknown"
}

func (k Kind) isLock() bool { return k == KindToolCall || k == KindResponse || k == KindReasoning }

// Bounds on key parts: a client cannot make a key larger than this. Session
// keys are ≤ 256 bytes after fastproxy/identity.go; ids are bounded by the
// local index's byte budget; model names come from the configuration.
const (
	MaxModelLen = 256
	MaxKeyLen   = 1024
)

// ErrKeyTooLong is returned for a model, session or id past the bounds.
var ErrKeyTooLong = errors.New("sharedstate: key part too long")

// keyPrefix returns "{prefix}:v{version}:".
func keyPrefix(prefix string, version int) string {
	return prefix + ":v" + strconv.Itoa(version) + ":"
}

// scopedKey appends {ns}{kind}:{len(model)}:{model}:{key}. The model is
// length-prefixed because model names may hold ':' (e.g. "llama3:8b").
func scopedKey(dst []byte, ns string, k Kind, model, key []byte) []byte {
	dst = append(dst, ns...)
	dst = append(dst, byte(k), ':')
	dst = strconv.AppendInt(dst, int64(len(model)), 10)
	dst = append(dst, ':')
	dst = append(dst, model...)
	dst = append(dst, ':')
	return append(dst, key...)
}

// lockKey appends {ns}{kind}:{id}: ids are global, not per model (§5).
func lockKey(dst []byte, ns string, k Kind, id []byte) []byte {
	dst = append(dst, ns...)
	dst = append(dst, byte(k), ':')
	return append(dst, id...)
}

// parseKey splits a key of namespace ns into kind, model ("" for locks)
// and the session or id. ok is false for keys of another namespace or
// schema version.
func parseKey(ns, key string) (k Kind, model, rest string, ok bool) {
	if len(key) < len(ns)+2 || key[:len(ns)] != ns || key[len(ns)+1] != ':' {
		return 0, "", "", false
	}
	k, key = Kind(key[len(ns)]), key[len(ns)+2:]
	if k.isLock() {
		return k, "", key, true
	}
	if k != KindBinding && k != KindMemory {
		return 0, "", "", false
	}
	i := 0
	for i < len(key) && key[i] >= '0' && key[i] <= '9' {
		i++
	}
	n, err := strconv.Atoi(key[:i])
	if err != nil || i >= len(key) || key[i] != ':' || len(key) < i+1+n+1 || key[i+1+n] != ':' {
		return 0, "", "", false
	}
	return k, key[i+1 : i+1+n], key[i+2+n:], true
}

// Lock is the owner of a hard lock (docs/design.md §5): the model that
// issued the id and, for previous_response_id and reasoning artifacts, the
// worker (by URL: worker ids are per process) that produced it.
type Lock struct {
	Model  string
	Worker string
}

// lockFormat is the first byte of an encoded Lock; a new layout takes a new
// byte, and decoders accept every byte they know.
const lockFormat = 1

func encodeLock(dst []byte, l Lock) []byte {
	dst = append(dst, lockFormat)
	dst = binary.AppendUvarint(dst, uint64(len(l.Model)))
	dst = append(dst, l.Model...)
	dst = binary.AppendUvarint(dst, uint64(len(l.Worker)))
	return append(dst, l.Worker...)
}

var errBadValue = errors.New("sharedstate: malformed value")

func decodeLock(b []byte) (Lock, error) {
	if len(b) == 0 || b[0] != lockFormat {
		return Lock{}, errBadValue
	}
	b = b[1:]
	var l Lock
	for i, dst := range [2]*string{&l.Model, &l.Worker} {
		n, w := binary.Uvarint(b)
		if w <= 0 || uint64(len(b)-w) < n {
			if i == 1 && len(b) == 0 { // tolerate a record without worker
				return l, nil
			}
			return Lock{}, errBadValue
		}
		*dst = string(b[w : w+int(n)])
		b = b[w+int(n):]
	}
	return l, nil
}
