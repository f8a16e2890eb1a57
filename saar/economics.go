package saar

import (
	"math"

	"github.com/warmroute/warmroute/sessionshard"
)

// The selectors and the switch economics of each policy version (package
// doc, docs/design.md §5). Every formula is a pure function of the config,
// the session settings and the turn.

// scoreV1 (v1): score = c·quality − (1−c)·normalized_price, where
// normalized_price = blended price / the highest blended price of the
// config's physical models (blended = (3·prompt + completion)/4 per 1M).
func scoreV1(m *Model, t turnPrice) Score {
	np := normPrice(t.maxBlend, m)
	b := t.c*m.Quality - (1-t.c)*np
	return Score{Model: m.Name, Quality: m.Quality, NormPrice: np, Base: b, Final: b}
}

// normPrice is m's blended price over the config's highest, maxBlend.
func normPrice(maxBlend float64, m *Model) float64 {
	if maxBlend > 0 {
		return m.Pricing.Blended() / maxBlend
	}
	return 0
}

// scoreV2 (v2) is the demand-calibrated selector: a turn of complexity c
// needs quality_score ≥ c (its demand), quality beyond the demand is worth
// nothing, and price costs price_sensitivity per unit of normalized
// blended price:
//
//	U(m, c) = min(quality_m, c) − price_sensitivity · normalized_price_m
//
// The best candidate maximizes U, ties going to the cheaper: with
// price_sensitivity → 0 that is the cheapest candidate meeting the demand
// (the best one when none does); a larger price_sensitivity accepts a
// shortfall of up to price_sensitivity · Δnormalized_price to pay less.
func scoreV2(m *Model, t turnPrice) Score {
	np := normPrice(t.maxBlend, m)
	u := min(m.Quality, t.c) - t.lambda*np
	return Score{Model: m.Name, Quality: m.Quality, NormPrice: np, Base: u, Final: u}
}

// scoreV3 is the v3 selector: the utility of v2 with the price of this
// very turn instead of the list blended price — the history the candidate
// holds warm (t.warmH tokens, the current model only) at its cached price,
// the rest of the history t.h at its prompt price, completionEstimate tokens at
// its completion price — normalized so that a reference turn
// (economics_ref_tokens at the highest blended price) costs 1:
//
//	U(m, c) = min(quality_m, c) − price_sensitivity · turn_usd_m / ref_usd
//
// Staying warm is cheaper by the re-prefill a switch pays, so v3's
// switch hurdle does not count it; a long history makes a dear model
// dearer, so the expensive model goes where it costs least per turn.
func scoreV3(m *Model, t turnPrice) Score {
	usd := (t.warmH*m.Pricing.CachedInputPer1M + (t.h-t.warmH)*m.Pricing.PromptPer1M + completionEstimate*m.Pricing.CompletionPer1M) / 1e6
	np := usd / t.ref
	u := min(m.Quality, t.c) - t.lambda*np
	return Score{Model: m.Name, Quality: m.Quality, NormPrice: np, Base: u, Final: u}
}

// betterV1 orders candidates for the v1 selector: the higher base score,
// then the first listed.
func betterV1(s, b *Score) bool { return s.Base > b.Base }

// betterUtility orders candidates for the v2 and v3 selectors: the higher
// utility, then the lower price (the cheapest candidate that meets the
// demand), then the first listed.
func betterUtility(s, b *Score) bool {
	return higherOrCheaper(s.Base, b.Base, s.NormPrice, b.NormPrice)
}

// higherOrCheaper reports whether value v beats bv, values within 1e-12
// of each other going to the lower price.
func higherOrCheaper(v, bv, price, bprice float64) bool {
	const eps = 1e-12
	return v > bv+eps || (v >= bv-eps && price < bprice)
}

// warmNormPrice (v3) is the normalized price of a following turn on m, the
// history h warm: h at the cached price, completionEstimate at the
// completion price, over the reference turn's price ref.
func warmNormPrice(m *Model, h, ref float64) float64 {
	if m == nil {
		return 0
	}
	return (h*m.Pricing.CachedInputPer1M + completionEstimate*m.Pricing.CompletionPer1M) / 1e6 / ref
}

// refUSD is the price of a reference turn: economics_ref_tokens at the
// config's highest blended price (1 when undefined).
func refUSD(cfg *Config, ls *SessionSettings) float64 {
	if r := cfg.maxBlend * ls.EconomicsRefTokens / 1e6; r > 0 {
		return r
	}
	return 1
}

// kappa is the exchange rate of versions 2 and 3, quality points per
// dollar: the selector charges price_sensitivity points for one reference
// turn (economics_ref_tokens tokens) at the config's highest blended
// price, so
//
//	κ = price_sensitivity · 1e6 / (max_blended_per_1m · economics_ref_tokens)
func kappa(cfg *Config, ls *SessionSettings) float64 {
	if cfg.maxBlend <= 0 || ls.EconomicsRefTokens <= 0 {
		return 0
	}
	return ls.PriceSensitivity * 1e6 / (cfg.maxBlend * ls.EconomicsRefTokens)
}

// switchTargetV1 is the economics of version 1, in score points: the
// current model (index ci of out.Scores) earns stay_bias and the
// prefix-cache value (cacheValue); a challenger pays switch_margin and the
// handoff penalty. It returns the base selector's choice when its final
// score beats the stay score, -1 to stay.
func switchTargetV1(d *decision, ci int) int {
	cs := &d.out.Scores[ci]
	cs.StayBias = d.ls.StayBias
	if !d.pol.NoEconomics {
		cs.CacheValue = cacheValue(d.cfg, d.ls, d.cfg.Model(d.cur()), d.in.HistoryTokens, d.mem)
	}
	cs.Final = cs.Base + cs.StayBias + cs.CacheValue
	for i := range d.out.Scores {
		if i == ci {
			continue
		}
		s := &d.out.Scores[i]
		s.Margin = d.ls.SwitchMargin
		if !d.pol.NoEconomics {
			s.Handoff = d.ls.HandoffPenalty
		}
		s.Final = s.Base - s.Margin - s.Handoff
	}
	if b := &d.out.Scores[d.best]; d.bestModel() == d.cur() || b.Down || b.Final <= cs.Final {
		return -1
	}
	return d.best
}

// chargeReprefill (v2) charges each challenger (every line but ci) the
// re-prefill of the warm history at its prompt price,
// H·(prompt_m − cached_m). Version 3 has it in the turn's price instead
// (scoreV3).
func chargeReprefill(d *decision, ci int) {
	if d.pol.NoEconomics {
		return
	}
	for i := range d.out.Scores {
		if i == ci {
			continue
		}
		s := &d.out.Scores[i]
		if m := d.cfg.Model(s.Model); m != nil {
			s.ReprefillUSD = d.h * (m.Pricing.PromptPer1M - m.Pricing.CachedInputPer1M) / 1e6
		}
	}
}

// priceSwitches (v2, v3) prices every switch away from the current model
// (index ci of out.Scores) in money and weighs it against the quality it
// buys; it returns the index of the challenger to switch to, or -1 to
// stay. With H the warm history in tokens, w the observed cache warmth of
// the current model, prices per token:
//
//	cost_usd(m) = reprefill_usd(m)                                 v2: H·(prompt_m − cached_m) (chargeReprefill); v3: 0
//	            + prefix_cache_weight · w · H·(prompt_cur − cached_cur)   warm cache lost on cur
//	            + handoff_penalty · H · prompt_m                  handoff overhead (schemas, template) as a share of the history
//	            + stay_bias · H · blended_cur                     continuity of staying, a share of the session's investment
//	gain(m)     = ΔU(c) + max(F·ΔŪ, −κ·back_usd)
//	ΔU(c)       = U(m, c) − U(cur, c), this turn's selector scores
//	ΔŪ          = follow(m) − follow(cur), a following turn at the session's demand (followV2, followV3); F = 2 following turns
//	back_usd    = H·(prompt_cur − cached_cur) + handoff_penalty · H · prompt_cur   (returning if they do not need m)
//	switch to the m with the largest gain(m) − (1+switch_margin)·κ·cost_usd(m) > 0
//
// Every cost term is proportional to H, so the hurdle grows linearly with
// the warm history and vanishes with it: whatever the keys' values, no class
// of switch is impossible — any quality gain (or price saving) moves a
// short enough session. Policy.NoEconomics sets cost_usd and back_usd to 0.
func priceSwitches(d *decision, ci int, follow follower) int {
	f := d.following()
	cs := &d.out.Scores[ci]
	cs.Final = 0
	k := kappa(d.cfg, d.ls)
	ucurD := follow(f, cs, d.cfg.Model(cs.Model))
	lost, stay, back := d.staysWarm(cs.Model)
	to := -1
	for i := range d.out.Scores {
		if i == ci {
			continue
		}
		s := &d.out.Scores[i]
		m := d.cfg.Model(s.Model)
		if !d.pol.NoEconomics && m != nil {
			s.HandoffUSD = d.ls.HandoffPenalty * d.h * m.Pricing.PromptPer1M / 1e6
			s.LostCacheUSD, s.StayUSD = lost, stay
		}
		cost := s.ReprefillUSD + s.LostCacheUSD + s.HandoffUSD + s.StayUSD
		ud := follow(f, s, m)
		s.Gain = (s.Base - cs.Base) + max(economicsFollowTurns*(ud-ucurD), -k*back)
		s.Hurdle = (1 + d.ls.SwitchMargin) * k * cost
		s.Final = s.Gain - s.Hurdle
		if !s.Down && s.Candidate && s.Final > 0 && (to < 0 || s.Final > d.out.Scores[to].Final) {
			to = i
		}
	}
	return to
}

// staysWarm (v2, v3) is what leaving the current model cur costs whatever
// the challenger, in dollars: its warm cache lost, the continuity of
// staying, and the price of coming back (priceSwitches). All 0 under
// Policy.NoEconomics or for a model the config does not know.
func (d *decision) staysWarm(cur string) (lost, stay, back float64) {
	m := d.cfg.Model(cur)
	if d.pol.NoEconomics || m == nil {
		return 0, 0, 0
	}
	cp, h := m.Pricing, d.h
	lost = d.ls.PrefixCacheWeight * warmth(d.ls, d.mem) * h * (cp.PromptPer1M - cp.CachedInputPer1M) / 1e6
	stay = d.ls.StayBias * h * cp.Blended() / 1e6
	back = h * (cp.PromptPer1M - cp.CachedInputPer1M + d.ls.HandoffPenalty*cp.PromptPer1M) / 1e6
	return lost, stay, back
}

// A follower values model m (line s of the turn's scores) on a turn that
// follows this one (priceSwitches).
type follower func(f following, s *Score, m *Model) float64

// following is what values a model on the turns after this one: the
// turn's scores, the session's demand (mean and standard deviation), the
// history and the prices.
type following struct {
	sc         []Score
	demand, sd float64
	h          float64
	lambda     float64 // price_sensitivity
	ref        float64 // refUSD
}

func (d *decision) following() following {
	return following{sc: d.out.Scores, demand: d.out.Demand, sd: math.Sqrt(max(d.out.DemandVar, 0)), h: d.h,
		lambda: d.ls.PriceSensitivity, ref: refUSD(d.cfg, d.ls)}
}

// followV2 (v2) values a following turn on s at the two demands d ± σ: U
// is concave in the demand, so its mean alone would overvalue a cheaper
// model.
func followV2(f following, s *Score, _ *Model) float64 {
	dLo, dHi := clamp01(f.demand-f.sd), clamp01(f.demand+f.sd)
	return (min(s.Quality, dLo)+min(s.Quality, dHi))/2 - f.lambda*s.NormPrice
}

// followV3 (v3) values a following turn on m over the session's demand
// spread (followU), priced with the history warm on m (warmNormPrice).
func followV3(f following, s *Score, m *Model) float64 {
	return followU(f.sc, s, f.demand, f.sd, f.lambda, warmNormPrice(m, f.h, f.ref))
}

// aheadModel (v3) is the choice where the session is free to choose
// (first turn, resets): the candidate up of the highest U(this turn) +
// F · Ū(following turns), the following turns at the session's demand and
// warm on the chosen model (followV3), ties to the cheaper; the base
// selector's choice when every candidate is down.
func aheadModel(d *decision) string {
	f := d.following()
	bi, bv := -1, 0.0
	for i := range d.out.Scores {
		s := &d.out.Scores[i]
		if s.Down || !s.Candidate {
			continue
		}
		v := s.Base + economicsFollowTurns*followV3(f, s, d.cfg.Model(s.Model))
		if bi < 0 || higherOrCheaper(v, bv, s.NormPrice, d.out.Scores[bi].NormPrice) {
			bi, bv = i, v
		}
	}
	if bi < 0 {
		return d.bestModel()
	}
	return d.out.Scores[bi].Model
}

// warmth is the observed share of the current model's prompt tokens that
// were cached, with cache_warmth_prior as 4096 tokens of pseudo-evidence.
func warmth(ls *SessionSettings, mem *sessionshard.MemoryState) float64 {
	return clamp01((float64(mem.CachedTokensSeen) + ls.CacheWarmthPrior*economicsWarmthWeight) /
		(float64(mem.PromptTokensSeen) + economicsWarmthWeight))
}

// cacheValue (v1) is the prefix-cache value of staying on model m, in score
// units:
//
//	value_usd = history_tokens · (prompt_per_1m − cached_input_per_1m) / 1e6 · warmth
//	warmth    = (cached_seen + prior·4096) / (prompt_seen + 4096)   (observed, with a prior)
//	value     = prefix_cache_weight · value_usd / ref_usd
//	ref_usd   = economics_ref_tokens · max prompt_per_1m of the config / 1e6
//
// i.e. the dollars a cache checkout would throw away, measured in "one
// reference prompt at the fleet's highest input price". It is linear in
// history tokens, so a longer session is never easier to move.
func cacheValue(cfg *Config, ls *SessionSettings, m *Model, historyTokens int, mem *sessionshard.MemoryState) float64 {
	if m == nil || cfg.maxPrompt <= 0 || ls.EconomicsRefTokens <= 0 || historyTokens <= 0 {
		return 0
	}
	delta := m.Pricing.PromptPer1M - m.Pricing.CachedInputPer1M
	if delta <= 0 {
		return 0
	}
	return ls.PrefixCacheWeight * float64(historyTokens) * delta * warmth(ls, mem) / (ls.EconomicsRefTokens * cfg.maxPrompt)
}

// followZ are the standard normal quantiles at (k+½)/8, k = 0..7: eight
// equally likely following turns.
var followZ = [8]float64{-1.5341, -0.8871, -0.4888, -0.1573, 0.1573, 0.4888, 0.8871, 1.5341}

// needQ is the quality_score of the cheapest candidate whose quality is at
// least x (the best candidate's when none is).
func needQ(sc []Score, x float64) float64 {
	q, np, best := -1.0, 0.0, 0.0
	for i := range sc {
		s := &sc[i]
		if !s.Candidate {
			continue
		}
		best = max(best, s.Quality)
		if s.Quality >= x && (q < 0 || s.NormPrice < np) {
			q, np = s.Quality, s.NormPrice
		}
	}
	if q < 0 {
		return best
	}
	return q
}

// followU (v3) is the expected utility of model s on a following turn
// whose complexity x is distributed Normal(d, sd²) (clamped to [0, 1]), a
// following turn needing the quality of the cheapest candidate that meets
// x (needQ: a tool loop that follows cannot move to a better model, so
// falling short of the tier costs the whole tier), priced at np:
//
//	Ū(m) = E[min(quality_m, need(x))] − price_sensitivity · np
func followU(sc []Score, s *Score, d, sd, lambda, np float64) float64 {
	var sum float64
	for _, z := range followZ {
		x := clamp01(d + z*sd)
		sum += min(s.Quality, needQ(sc, x))
	}
	return sum/float64(len(followZ)) - lambda*np
}
