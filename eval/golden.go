package eval

import (
	"errors"
	"fmt"
	"os"
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

// check validates decoded conversations beyond their shape (see Decode),
// as firmware.CheckGolden does for verify and install.
func check(cs []Conversation) error {
	if err := firmware.CheckGolden(cs); err != nil {
		return fmt.Errorf("%w: %w", ErrGolden, err)
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

// CheckNames refuses, as a bad golden file (ErrGolden), a conversation
// that expects a node its agent, one of bundle b's, does not have (in a
// path or an interrupt), or a tool b's registry does not have, with the
// message firmware verify gives for such a golden file of a bundle's own
// (firmware.Bundle.CheckGoldenNames). A conversation whose agent b lacks is
// not checked.
func CheckNames(convs []Conversation, b *firmware.Bundle) error {
	if err := b.CheckGoldenNames(convs); err != nil {
		return fmt.Errorf("%w: %w", ErrGolden, err)
	}
	return nil
}

// CheckFlags refuses, as a bad golden file (ErrGolden), a conversation
// that expects a flag its agent, one of bundle b's, can never raise on
// channel, the one the replay reads the flags from (Options.FlagsChannel;
// "" for "flags"). Where that is not known (an agent b lacks, a channel
// that other writes may fill, see firmware.Bundle.CheckGoldenFlags) nothing
// is checked.
func CheckFlags(convs []Conversation, b *firmware.Bundle, channel string) error {
	if channel == "" {
		channel = firmware.DefaultFlagsChannel
	}
	if err := b.CheckGoldenFlags(convs, channel); err != nil {
		return fmt.Errorf("%w: %w", ErrGolden, err)
	}
	return nil
}
