package reqview

import "crypto/sha256"

// ReasoningID identifies an opaque reasoning artifact (docs/design.md §5,
// "Hard locks"): the first 16 bytes of the SHA-256 of the raw JSON string
// content of its encrypted_content, signature or redacted data, as it
// appears on the wire (escapes not decoded). A response and the request
// that echoes the artifact back give the same id. The zero value is none.
type ReasoningID [16]byte

// IsZero reports whether id is none.
func (id ReasoningID) IsZero() bool { return id == ReasoningID{} }

// reasoningIDOf hashes raw string content; empty content has no id.
func reasoningIDOf(raw []byte) ReasoningID {
	var id ReasoningID
	if len(raw) == 0 {
		return id
	}
	sum := sha256.Sum256(raw)
	copy(id[:], sum[:16])
	return id
}

// MaxReasoningIDs bounds Learned.ReasoningIDs: past it, the last slot
// holds the latest artifact.
const MaxReasoningIDs = 8
