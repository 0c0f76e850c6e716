package eval

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// compare returns the first difference between what a turn expects and
// what it produced, or "" when every given expectation holds. The order of
// the checks puts the most telling difference first: a wrong status or
// interrupt explains a wrong path, and a wrong path a wrong answer.
func compare(want *Expect, got *Observed) string {
	if want == nil {
		return ""
	}
	if want.Status != "" && want.Status != got.Status {
		msg := fmt.Sprintf("status: want %s, got %s", want.Status, got.Status)
		if got.Error != "" {
			msg += " (" + got.Error + ")"
		}
		if got.Interrupt != "" {
			msg += " at " + got.Interrupt
		}
		return msg
	}
	if want.Interrupt != "" && want.Interrupt != got.Interrupt {
		return fmt.Sprintf("interrupt: want %s, got %s", want.Interrupt, orNone(got.Interrupt))
	}
	if want.Path != nil {
		if d := sequenceDiff("path", want.Path, got.Path); d != "" {
			return d
		}
	}
	if want.Tools != nil {
		if d := sequenceDiff("tools", want.Tools, got.Tools); d != "" {
			return d
		}
	}
	if want.Flags != nil {
		if d := setDiff("flags", want.Flags, got.Flags); d != "" {
			return d
		}
	}
	for _, s := range want.FinalContains {
		if !strings.Contains(got.Final, s) {
			return fmt.Sprintf("final answer lacks %q: %s", s, quoteShort(got.Final))
		}
	}
	if want.FinalRegex != "" {
		re, err := regexp.Compile(want.FinalRegex)
		if err != nil { // Decode checks; a hand-built Expect may not be checked
			return fmt.Sprintf("final_regex: %v", err)
		}
		if !re.MatchString(got.Final) {
			return fmt.Sprintf("final answer does not match /%s/: %s", want.FinalRegex, quoteShort(got.Final))
		}
	}
	return ""
}

// sequenceDiff names the first index where two sequences differ.
func sequenceDiff(what string, want, got []string) string {
	for i := range max(len(want), len(got)) {
		w, g := at(want, i), at(got, i)
		if w != g {
			verb := "differs"
			if strings.HasSuffix(what, "s") {
				verb = "differ"
			}
			return fmt.Sprintf("%s %s at index %d: want %s, got %s; got %s", what, verb, i, w, g, list(got))
		}
	}
	return ""
}

func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return "nothing (ends)"
}

// setDiff compares two sets, ignoring order and repeats.
func setDiff(what string, want, got []string) string {
	var missing, extra []string
	for _, w := range want {
		if !slices.Contains(got, w) && !slices.Contains(missing, w) {
			missing = append(missing, w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) && !slices.Contains(extra, g) {
			extra = append(extra, g)
		}
	}
	if len(missing) == 0 && len(extra) == 0 {
		return ""
	}
	var parts []string
	if len(missing) > 0 {
		parts = append(parts, "missing "+strings.Join(missing, ", "))
	}
	if len(extra) > 0 {
		parts = append(parts, "unexpected "+strings.Join(extra, ", "))
	}
	return fmt.Sprintf("%s differ: %s; want %s, got %s", what, strings.Join(parts, "; "), list(want), list(got))
}

func list(s []string) string { return "[" + strings.Join(s, " ") + "]" }

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// quoteShort quotes text for a one-line message, cut to a readable length.
func quoteShort(s string) string {
	const limit = 160
	if r := []rune(s); len(r) > limit {
		return fmt.Sprintf("%q…", string(r[:limit]))
	}
	return fmt.Sprintf("%q", s)
}
