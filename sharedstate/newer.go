package sharedstate

import (
	"crypto/sha1"
	"encoding/hex"
	"strconv"

	"github.com/redis/rueidis"
)

// Of two writes of one binding or memory record, the newer stays, whatever
// order they reach Redis in: the async queues of two replicas, or their
// replay after an outage (docs/design.md §8.3, doc.go "Consistency model").
// Each write is a script that compares versions in Redis.

// memoryLua writes the memory record ARGV[1] to KEYS[1] with a TTL of
// ARGV[2] ms unless the stored record is newer. A record starts with the
// header ARGV[3] (memoryHeader) and its version, eight bytes little endian,
// compared from the most significant byte (no number conversion: Lua's are
// doubles). A tie is written (a replica's next write of one turn). A record
// without the header, stored or written (a release before), is written
// over, or written as before: last writer wins.
const memoryLua = `local h, v = ARGV[3], ARGV[1]
local n = #h
if #v >= n + 8 and string.sub(v, 1, n) == h then
  local cur = redis.call('GET', KEYS[1])
  if cur and #cur >= n + 8 and string.sub(cur, 1, n) == h then
    for i = n + 8, n + 1, -1 do
      local a, b = string.byte(cur, i), string.byte(v, i)
      if a ~= b then
        if a > b then return 0 end
        break
      end
    end
  end
end
redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
return 1`

// bindingLua writes the worker URL ARGV[1] to KEYS[1] to expire at ARGV[2]
// (unix ms): the time the binding was made or last used plus its TTL. The
// expiry is the version: the stored binding stays when it expires later
// (one session key has one TTL); a tie is written. The value stays a bare
// URL, as releases before read it. Redis 7.0 compares absolute expiries
// (PEXPIRETIME, PXAT). Before 7.0 the stored expiry is TIME + PTTL, which
// may read two clocks a scheduling delay apart: that path calls a binding
// within 1 ms a tie, and refuses one whose expiry has passed.
const bindingLua = `local exp = tonumber(ARGV[2])
local t = redis.pcall('PEXPIRETIME', KEYS[1])
if type(t) == 'number' then
  if t > exp then return 0 end
  redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[2])
  return 1
end
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local p = redis.call('PTTL', KEYS[1])
if exp <= now or (p >= 0 and now + p > exp + 1) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', exp - now)
return 1`

func sha(script string) string {
	h := sha1.Sum([]byte(script))
	return hex.EncodeToString(h[:])
}

var memorySha, bindingSha = sha(memoryLua), sha(bindingLua)

// versioned reports whether o is written by a script (a binding or memory
// write, not a delete).
func (o *asyncOp) versioned() bool {
	return !o.del && (o.kind == KindBinding || o.kind == KindMemory)
}

// script returns o's script command: EVALSHA, or EVAL when Redis lacks
// the script. o.versioned() must hold.
func (o *asyncOp) script(c rueidis.Client, eval bool) rueidis.Completed {
	body, hash, args := memoryLua, memorySha, []string{o.val, strconv.FormatInt(o.ttlMs, 10), memoryHeader}
	if o.kind == KindBinding {
		body, hash, args = bindingLua, bindingSha, []string{o.val, strconv.FormatInt(o.expMs, 10)}
	}
	if eval {
		return c.B().Eval().Script(body).Numkeys(1).Key(o.key).Arg(args...).Build()
	}
	return c.B().Evalsha().Sha1(hash).Numkeys(1).Key(o.key).Arg(args...).Build()
}
