package firmware

import (
	"math"
	"sort"
	"strings"
	"unicode"
)

// bm25 is a keyword index over the knowledge base, scored with Okapi BM25
// (k1 1.2, b 0.75). The knowledge base of a bundle is small, so the index is
// built in memory on first use and never persisted.
type bm25 struct {
	docs  []Doc
	terms []map[string]int // per doc: term -> count
	lens  []int
	avg   float64
	df    map[string]int
}

func (b *Bundle) index() *bm25 {
	b.indexOnce.Do(func() { b.idx = newBM25(b.Docs) })
	return b.idx
}

func newBM25(docs []Doc) *bm25 {
	ix := &bm25{docs: docs, df: map[string]int{}}
	total := 0
	for _, d := range docs {
		tf := map[string]int{}
		toks := tokenize(d.Title + " " + d.Text)
		for _, t := range toks {
			tf[t]++
		}
		for t := range tf {
			ix.df[t]++
		}
		ix.terms = append(ix.terms, tf)
		ix.lens = append(ix.lens, len(toks))
		total += len(toks)
	}
	if len(docs) > 0 {
		ix.avg = float64(total) / float64(len(docs))
	}
	return ix
}

// search returns up to k documents that share a term with query, best
// first (ties by id), with their scores.
func (ix *bm25) search(query string, k int) []Doc {
	const k1, b = 1.2, 0.75
	n := float64(len(ix.docs))
	q := map[string]bool{}
	for _, t := range tokenize(query) {
		q[t] = true
	}
	type hit struct {
		i     int
		score float64
	}
	var hits []hit
	for i, tf := range ix.terms {
		score := 0.0
		for t := range q {
			f := float64(tf[t])
			if f == 0 {
				continue
			}
			df := float64(ix.df[t])
			idf := math.Log(1 + (n-df+0.5)/(df+0.5))
			score += idf * f * (k1 + 1) / (f + k1*(1-b+b*float64(ix.lens[i])/ix.avg))
		}
		if score > 0 {
			hits = append(hits, hit{i, score})
		}
	}
	sort.Slice(hits, func(a, c int) bool {
		if hits[a].score != hits[c].score {
			return hits[a].score > hits[c].score
		}
		return ix.docs[hits[a].i].ID < ix.docs[hits[c].i].ID
	})
	var out []Doc
	for j, h := range hits {
		if j == k {
			break
		}
		d := ix.docs[h.i]
		d.Score = math.Round(h.score*1000) / 1000
		out = append(out, d)
	}
	return out
}

// stopwords are too common to tell documents apart.
var stopwords = map[string]bool{
	"a": true, "an": true, "and": true, "are": true, "as": true, "at": true, "be": true, "by": true, "do": true,
	"for": true, "from": true, "how": true, "i": true, "if": true, "in": true, "is": true, "it": true, "my": true,
	"of": true, "on": true, "or": true, "should": true, "that": true, "the": true, "this": true, "to": true,
	"was": true, "what": true, "when": true, "with": true, "you": true, "your": true, "me": true, "can": true,
}

func tokenize(s string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	}) {
		if !stopwords[f] {
			out = append(out, f)
		}
	}
	return out
}
