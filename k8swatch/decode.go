package k8swatch

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"strconv"
)

// The parts of the Kubernetes API objects the watch reads (the API
// reference's Pod, PodList, WatchEvent and Status); every other field is
// skipped by the decoder.

type objectMeta struct {
	Name              string            `json:"name"`
	Namespace         string            `json:"namespace"`
	UID               string            `json:"uid"`
	ResourceVersion   string            `json:"resourceVersion"`
	DeletionTimestamp *string           `json:"deletionTimestamp"`
	Labels            map[string]string `json:"labels"`
	Annotations       map[string]string `json:"annotations"`
}

type podJSON struct {
	Metadata objectMeta `json:"metadata"`
	Status   struct {
		Phase      string `json:"phase"`
		PodIP      string `json:"podIP"`
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
	} `json:"status"`
}

type podListJSON struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue"`
	} `json:"metadata"`
	Items []podJSON `json:"items"`
}

// statusJSON is a metav1.Status: the object of an ERROR event, and the body
// of a failed call.
type statusJSON struct {
	Kind    string `json:"kind"`
	Status  string `json:"status"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
	Code    int    `json:"code"`
}

// EventType is a watch event's type.
type EventType string

// The watch event types of the Kubernetes API.
const (
	Added    EventType = "ADDED"
	Modified EventType = "MODIFIED"
	Deleted  EventType = "DELETED"
	Bookmark EventType = "BOOKMARK"
	Error    EventType = "ERROR"
)

// Event is one decoded watch event: the pod of ADDED, MODIFIED and DELETED;
// the resource version of BOOKMARK (and of the pod events); the status code
// and message of ERROR.
type Event struct {
	Type            EventType
	Pod             Pod
	ResourceVersion string
	Code            int    // ERROR: the Status's code (410: the resource version is gone)
	Message         string // ERROR: the Status's message
}

// Pod is what the discovery keeps of a pod.
type Pod struct {
	Namespace, Name string
	IP              string            // status.podIP; "" before it has one
	Ready           bool              // phase Running, condition Ready True, not being deleted
	Labels          map[string]string // the event's, to check the selector again; not kept by the Watcher
	Annotations     map[string]string // only the keys Config.Annotations names
}

// Key is namespace/name, unique in a cluster.
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

var (
	errFrame    = errors.New("watch stream: not a JSON object")
	errTooLarge = errors.New("watch stream: event larger than the limit")
)

// readFrame reads the next JSON object of a watch stream into buf: the
// API server writes one object per line, but only the braces are trusted,
// so concatenated objects read the same. An object longer than max is an
// error (the stream is then dropped and the watch reconnects).
func readFrame(br *bufio.Reader, buf []byte, max int) ([]byte, error) {
	buf = buf[:0]
	depth, inStr, esc := 0, false, false
	for {
		c, err := br.ReadByte()
		if err != nil {
			if errors.Is(err, io.EOF) && len(buf) > 0 {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if len(buf) == 0 {
			switch c {
			case ' ', '\t', '\r', '\n':
				continue
			case '{':
			default:
				return nil, errFrame
			}
		}
		if len(buf) >= max {
			return nil, errTooLarge
		}
		buf = append(buf, c)
		switch {
		case inStr && esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case inStr:
			inStr = c != '"'
		case c == '"':
			inStr = true
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
			if depth == 0 {
				return buf, nil
			}
		}
	}
}

// decodeEvent decodes one watch event; keep names the annotations kept.
func decodeEvent(b []byte, keep []string) (Event, error) {
	var raw struct {
		Type   EventType       `json:"type"`
		Object json.RawMessage `json:"object"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return Event{}, err
	}
	ev := Event{Type: raw.Type}
	switch raw.Type {
	case Added, Modified, Deleted:
		var p podJSON
		if err := json.Unmarshal(raw.Object, &p); err != nil {
			return Event{}, err
		}
		if p.Metadata.Name == "" {
			return Event{}, errors.New("watch event: pod without a name")
		}
		ev.Pod, ev.ResourceVersion = p.pod(keep), p.Metadata.ResourceVersion
	case Bookmark:
		var p podJSON
		if err := json.Unmarshal(raw.Object, &p); err != nil {
			return Event{}, err
		}
		ev.ResourceVersion = p.Metadata.ResourceVersion
	case Error:
		var s statusJSON
		if err := json.Unmarshal(raw.Object, &s); err != nil {
			return Event{}, err
		}
		ev.Code, ev.Message = s.Code, s.Message
	default:
		return Event{}, errors.New("watch event: unknown type " + strconv.Quote(string(raw.Type)))
	}
	return ev, nil
}

// pod is what the discovery keeps of p.
func (p *podJSON) pod(keep []string) Pod {
	out := Pod{Namespace: p.Metadata.Namespace, Name: p.Metadata.Name, IP: p.Status.PodIP, Labels: p.Metadata.Labels}
	ready := false
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			ready = c.Status == "True"
		}
	}
	out.Ready = ready && p.Status.Phase == "Running" && p.Status.PodIP != "" && p.Metadata.DeletionTimestamp == nil
	for _, k := range keep {
		if v, ok := p.Metadata.Annotations[k]; ok {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	return out
}
