// Package promtext writes label values for the Prometheus text exposition
// format: the one escaping function every metric of warmroute uses.
//
// The format escapes exactly three characters in a label value — backslash,
// double quote and line feed — and requires UTF-8; strconv.Quote is wrong for
// it (it writes \x01 and \u00e9 style escapes that parsers reject or misread).
package promtext

import "unicode/utf8"

// AppendLabelValue appends v to dst as a quoted label value: `"` + escaped v
// + `"`. Invalid UTF-8 becomes U+FFFD, so any byte string gives a valid line.
func AppendLabelValue(dst []byte, v string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(v); {
		c := v[i]
		if c < utf8.RuneSelf {
			switch c {
			case '\\':
				dst = append(dst, `\\`...)
			case '"':
				dst = append(dst, `\"`...)
			case '\n':
				dst = append(dst, `\n`...)
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(v[i:])
		if r == utf8.RuneError && n == 1 {
			dst = utf8.AppendRune(dst, utf8.RuneError)
		} else {
			dst = append(dst, v[i:i+n]...)
		}
		i += n
	}
	return append(dst, '"')
}

// Label returns `name="escaped value"`, for building a series name such as
// `metric{` + Label("worker", url) + `}`.
func Label(name, value string) string {
	b := make([]byte, 0, len(name)+len(value)+3)
	b = append(b, name...)
	b = append(b, '=')
	return string(AppendLabelValue(b, value))
}
