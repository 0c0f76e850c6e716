package eval

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/firmware"
)

// Conversation, Turn, Expect and Resume are the golden format's types. They
// are firmware's, so that a bundle's golden files and "outpost eval" read
// the same format with the same decoder.
type (
	Conversation = firmware.Conversation
	Turn         = firmware.Turn
	Expect       = firmware.Expect
	Resume       = firmware.Resume
)

// statuses a turn may expect: a turn ends at one of them.
var statuses = map[string]bool{
	string(engine.StatusCompleted): true, string(engine.StatusInterrupted): true,
	string(engine.StatusFailed): true, string(engine.StatusCancelled): true,
	string(engine.StatusBudgetExceeded): true,
}

// Load reads golden files, in order. A file that holds no conversation is
// not an error; a set of files holding none at all is (ErrNoConversations).
func Load(files ...string) ([]Conversation, error) {
	var out []Conversation
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrGolden, err)
		}
		cs, err := Decode(f, data)
		if err != nil {
			return nil, err
		}
		out = append(out, cs...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w in %s", ErrNoConversations, strings.Join(files, ", "))
	}
	return out, nil
}

// Decode reads one golden file: one conversation a JSON line, blank lines and
// lines starting with '#' skipped. Decoding is strict: an unknown field is an
// error naming the file, the line and the field. Beyond the shape, it checks
// what would otherwise only fail at replay: every turn has an input, a
// status is one a turn can end in, a regular expression compiles, a resume
// decision is approve, reject or edit (with a value), after_resume comes
// with a resume, and names are unique within the file.
func Decode(file string, data []byte) ([]Conversation, error) {
	cs, err := firmware.DecodeGolden(file, data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrGolden, err)
	}
	if err := check(cs); err != nil {
		return nil, err
	}
	return cs, nil
}

// Bundled returns the golden conversations that bundle b ships (its
// manifest's golden files), checked as Decode checks a file's. A bundle
// that ships none is ErrNoConversations.
func Bundled(b *firmware.Bundle) ([]Conversation, error) {
	if len(b.Golden) == 0 {
		return nil, fmt.Errorf("%w in bundle %s", ErrNoConversations, b.Manifest)
	}
	if err := check(b.Golden); err != nil {
		return nil, fmt.Errorf("bundle %s: %w", b.Manifest, err)
	}
	return b.Golden, nil
}

// check validates decoded conversations beyond their shape (see Decode).
// Names are unique within a file.
func check(cs []Conversation) error {
	type named struct{ file, name string }
	seen := map[named]int{}
	for _, c := range cs {
		if prev, dup := seen[named{c.File, c.Name}]; dup {
			return fmt.Errorf("%w: %s:%d: conversation %q: name already used on line %d", ErrGolden, c.File, c.Line, c.Name, prev)
		}
		seen[named{c.File, c.Name}] = c.Line
		if err := validate(c); err != nil {
			return fmt.Errorf("%w: %s:%d: conversation %q: %w", ErrGolden, c.File, c.Line, c.Name, err)
		}
	}
	return nil
}

func validate(c Conversation) error {
	for i, t := range c.Turns {
		at := fmt.Sprintf("turns.%d", i)
		if len(t.Input) == 0 {
			return fmt.Errorf("%s.input: every turn needs an input", at)
		}
		if err := validateExpect(at+".expect", t.Expect); err != nil {
			return err
		}
		if t.AfterResume != nil && t.Resume == nil {
			return fmt.Errorf("%s.after_resume: given without a resume", at)
		}
		if t.Resume != nil {
			d := engine.Decision{Kind: t.Resume.Decision, Value: t.Resume.Value, Reason: t.Resume.Reason}
			if err := d.Validate(); err != nil {
				return fmt.Errorf("%s.resume.decision: %w", at, err)
			}
			if t.Expect != nil && t.Expect.Status != "" && t.Expect.Status != string(engine.StatusInterrupted) {
				return fmt.Errorf("%s.resume: the turn expects status %s, so there is nothing to resume", at, t.Expect.Status)
			}
		}
		if err := validateExpect(at+".after_resume", t.AfterResume); err != nil {
			return err
		}
	}
	return nil
}

func validateExpect(at string, e *Expect) error {
	if e == nil {
		return nil
	}
	if e.Status != "" && !statuses[e.Status] {
		return fmt.Errorf("%s.status: %q is not a status a turn ends in (completed, interrupted, failed, cancelled, budget_exceeded)", at, e.Status)
	}
	if e.Interrupt != "" && e.Status != "" && e.Status != string(engine.StatusInterrupted) {
		return fmt.Errorf("%s.interrupt: given with status %s", at, e.Status)
	}
	if e.FinalRegex != "" {
		if _, err := regexp.Compile(e.FinalRegex); err != nil {
			return fmt.Errorf("%s.final_regex: %w", at, err)
		}
	}
	return nil
}

// CheckAgents resolves every conversation's agent as a new run's, before
// any is replayed, so that a golden file naming an agent that resolve does
// not know is a bad golden file (ErrGolden, naming the file and the line),
// which no replay can pass, rather than a conversation that failed. Run
// alone reports such a conversation as a failed Case.
func CheckAgents(convs []Conversation, resolve engine.Resolver) error {
	checked := map[string]bool{}
	for _, c := range convs {
		if checked[c.Agent] {
			continue
		}
		checked[c.Agent] = true
		if _, err := resolve(c.Agent, engine.BundleRef{}); errors.Is(err, engine.ErrUnknownAgent) {
			return fmt.Errorf("%w: %s:%d: conversation %q: %w", ErrGolden, c.File, c.Line, c.Name, err)
		}
	}
	return nil
}
