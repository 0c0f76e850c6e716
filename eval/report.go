package eval

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// Report is the outcome of a Run: one Case per conversation, in the order
// they were given.
type Report struct {
	Cases    []Case
	Passed   int
	Failed   int
	Duration time.Duration
}

// Case is one conversation's outcome.
type Case struct {
	Name  string
	Agent string
	File  string
	Line  int
	Turns int // turns in the conversation
	// Passed is true when every turn met its expectations.
	Passed bool
	// Failure is the first difference ("turn 2: path differs at index
	// 3: ..."), or why the conversation could not be replayed.
	Failure  string
	Duration time.Duration
	// Results holds what each replayed turn produced, up to the failure.
	Results []TurnResult
}

// TurnResult is what one turn produced.
type TurnResult struct {
	Turn        int       `json:"turn"` // from 1
	Observed    *Observed `json:"observed,omitempty"`
	AfterResume *Observed `json:"after_resume,omitempty"`
}

// Err is ErrFailed when a conversation failed, nil otherwise.
func (r *Report) Err() error {
	if r.Failed > 0 {
		return fmt.Errorf("%w: %d of %d", ErrFailed, r.Failed, len(r.Cases))
	}
	return nil
}

// WriteTable prints a table of the cases, then the first difference of each
// failure, then a summary line.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tAGENT\tTURNS\tRESULT\tTIME")
	for _, c := range r.Cases {
		res := "pass"
		if !c.Passed {
			res = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", c.Name, c.Agent, c.Turns, res, round(c.Duration))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.Failed > 0 {
		fmt.Fprintln(w)
		for _, c := range r.Cases {
			if !c.Passed {
				fmt.Fprintf(w, "FAIL %s (%s:%d): %s\n", c.Name, c.File, c.Line, c.Failure)
			}
		}
	}
	noun := "conversations"
	if len(r.Cases) == 1 {
		noun = "conversation"
	}
	_, err := fmt.Fprintf(w, "\n%d %s: %d passed, %d failed (%s)\n", len(r.Cases), noun, r.Passed, r.Failed, round(r.Duration))
	return err
}

// WriteJSON writes the report as one indented JSON object:
// {"passed","failed","duration_ms","cases":[{"name","agent","file","line",
// "turns","passed","duration_ms","failure"?,"results"}]}.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// MarshalJSON implements json.Marshaler.
func (r *Report) MarshalJSON() ([]byte, error) {
	cases := r.Cases
	if cases == nil {
		cases = []Case{}
	}
	return json.Marshal(struct {
		Passed     int     `json:"passed"`
		Failed     int     `json:"failed"`
		DurationMS float64 `json:"duration_ms"`
		Cases      []Case  `json:"cases"`
	}{r.Passed, r.Failed, ms(r.Duration), cases})
}

// MarshalJSON implements json.Marshaler.
func (c Case) MarshalJSON() ([]byte, error) {
	results := c.Results
	if results == nil {
		results = []TurnResult{}
	}
	return json.Marshal(struct {
		Name       string       `json:"name"`
		Agent      string       `json:"agent"`
		File       string       `json:"file,omitempty"`
		Line       int          `json:"line,omitempty"`
		Turns      int          `json:"turns"`
		Passed     bool         `json:"passed"`
		DurationMS float64      `json:"duration_ms"`
		Failure    string       `json:"failure,omitempty"`
		Results    []TurnResult `json:"results"`
	}{c.Name, c.Agent, c.File, c.Line, c.Turns, c.Passed, ms(c.Duration), c.Failure, results})
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

// TerminalProgress returns a Progress function that redraws one counter line
// on w ("\r[12/40] 1 failed"), for a terminal, and ends it with a newline
// after the last conversation.
func TerminalProgress(w io.Writer) func(done, total int, c *Case) {
	failed := 0
	return func(done, total int, c *Case) {
		if !c.Passed {
			failed++
		}
		fmt.Fprintf(w, "\r\x1b[K[%d/%d] %s", done, total, c.Name)
		if failed > 0 {
			fmt.Fprintf(w, " (%d failed)", failed)
		}
		if done == total {
			fmt.Fprintln(w)
		}
	}
}

// LineProgress returns a Progress function that prints a line per
// conversation on w, for logs.
func LineProgress(w io.Writer) func(done, total int, c *Case) {
	return func(done, total int, c *Case) {
		res := "ok  "
		if !c.Passed {
			res = "FAIL"
		}
		fmt.Fprintf(w, "[%d/%d] %s %s (%s)\n", done, total, res, c.Name, round(c.Duration))
	}
}
