package tenantlimit

import (
	"context"
	"errors"
	"time"

	"github.com/redis/rueidis"

	"github.com/warmroute/warmroute/sharedstate"
)

// Redis is a Store in Redis, shared by the router's replicas (--redis-url):
// a tenant's window is one hash, "{namespace}tl:{tenant}:{window}", with
// the fields r (requests) and t (tokens), expiring after its window. Each
// check and each charge is one atomic script (one round trip), so
// replicas never count past a limit together. Windows follow each
// replica's clock: replicas whose clocks differ by a few milliseconds
// share a window but for those milliseconds at its edges.
type Redis struct {
	s *sharedstate.Store
}

// NewRedis returns a Store in s's Redis.
func NewRedis(s *sharedstate.Store) *Redis { return &Redis{s: s} }

// admitLua counts one request in KEYS[1] unless its requests reached
// ARGV[1] or its tokens ARGV[2] (0: no limit); the key expires after
// ARGV[3] ms. It returns {admitted (1 or 0), requests, tokens}.
var admitLua = rueidis.NewLuaScript(`local c = redis.call('HMGET', KEYS[1], 'r', 't')
local r, t = tonumber(c[1]) or 0, tonumber(c[2]) or 0
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
if (rpm > 0 and r >= rpm) or (tpm > 0 and t >= tpm) then
  return {0, r, t}
end
r = redis.call('HINCRBY', KEYS[1], 'r', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, r, t}`)

// chargeLua adds ARGV[1] tokens to KEYS[1], which expires after ARGV[2]
// ms, and returns {requests, tokens}.
var chargeLua = rueidis.NewLuaScript(`local t = redis.call('HINCRBY', KEYS[1], 't', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {tonumber(redis.call('HGET', KEYS[1], 'r')) or 0, t}`)

// errReply: a script's answer of the wrong shape.
var errReply = errors.New("tenantlimit: unexpected reply from redis")

// key returns tenant's key for window w and the key's time to live: the
// window's rest and a second for clocks that lag.
func (s *Redis) key(tenant string, now time.Time) (key, ttl string, reset time.Duration) {
	w, reset := window(now)
	return s.s.Namespace() + "tl:" + tenant + ":" + itoa(w), itoa((reset + time.Second).Milliseconds()), reset
}

// Admit implements Store.
func (s *Redis) Admit(ctx context.Context, tenant string, lim Limits, now time.Time) (Window, bool, error) {
	key, ttl, reset := s.key(tenant, now)
	v, err := s.s.Script(ctx, admitLua, []string{key}, []string{itoa(lim.RPM), itoa(lim.TPM), ttl})
	if err != nil {
		return Window{}, false, err
	}
	if len(v) != 3 {
		return Window{}, false, errReply
	}
	return Window{Requests: v[1], Tokens: v[2], Reset: reset}, v[0] == 1, nil
}

// Charge implements Store.
func (s *Redis) Charge(ctx context.Context, tenant string, tokens int64, now time.Time) (Window, error) {
	key, ttl, reset := s.key(tenant, now)
	v, err := s.s.Script(ctx, chargeLua, []string{key}, []string{itoa(tokens), ttl})
	if err != nil {
		return Window{}, err
	}
	if len(v) != 2 {
		return Window{}, errReply
	}
	return Window{Requests: v[0], Tokens: v[1], Reset: reset}, nil
}
