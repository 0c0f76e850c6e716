package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
)

// Runs are written once or twice per turn, so JSON inside the envelope is
// cheap enough. The record mirrors engine.Run with []byte where the run has
// json.RawMessage: encoding/json compacts and validates raw messages, and a
// store must give back the bytes it was given.
const runVersion = 1

type runRecord struct {
	ID            string            `json:"id"`
	Thread        string            `json:"thread"`
	Agent         string            `json:"agent"`
	Status        engine.RunStatus  `json:"status"`
	Bundle        engine.BundleRef  `json:"bundle"`
	CorrelationID string            `json:"correlation_id"`
	Input         []byte            `json:"input"`
	Output        []byte            `json:"output"`
	Error         string            `json:"error"`
	Interrupts    []interruptRecord `json:"interrupts"`
	Decisions     []decisionRecord  `json:"decisions"`
	Checkpoint    string            `json:"checkpoint"`
	Steps         int               `json:"steps"`
	Durability    engine.Durability `json:"durability"`
	Meta          map[string]string `json:"meta"`
	CreatedAt     time.Time         `json:"created_at"`
	StartedAt     time.Time         `json:"started_at"`
	EndedAt       time.Time         `json:"ended_at"`
}

type interruptRecord struct {
	ID      string `json:"id"`
	Node    string `json:"node"`
	NS      string `json:"ns"`
	TaskID  string `json:"task_id"`
	Index   int    `json:"index"`
	Payload []byte `json:"payload"`
}

type decisionRecord struct {
	Interrupt string    `json:"interrupt"`
	Decision  string    `json:"decision"`
	Value     []byte    `json:"value"`
	Reason    string    `json:"reason"`
	By        string    `json:"by"`
	At        time.Time `json:"at"`
}

func encodeRun(r *engine.Run) ([]byte, error) {
	rec := runRecord{
		ID: r.ID, Thread: r.Thread, Agent: r.Agent, Status: r.Status, Bundle: r.Bundle,
		CorrelationID: r.CorrelationID, Input: r.Input, Output: r.Output, Error: r.Error,
		Checkpoint: r.Checkpoint, Steps: r.Steps, Durability: r.Durability, Meta: r.Meta,
		CreatedAt: r.CreatedAt, StartedAt: r.StartedAt, EndedAt: r.EndedAt,
	}
	for _, in := range r.Interrupts {
		rec.Interrupts = append(rec.Interrupts, interruptRecord{
			ID: in.ID, Node: in.Node, NS: in.NS, TaskID: in.TaskID, Index: in.Index, Payload: in.Payload})
	}
	for _, dr := range r.Decisions {
		rec.Decisions = append(rec.Decisions, decisionRecord{
			Interrupt: dr.Interrupt, Decision: dr.Decision, Value: dr.Value, Reason: dr.Reason, By: dr.By, At: dr.At})
	}
	return encodeJSONRecord(runVersion, &rec)
}

func decodeRun(b []byte) (*engine.Run, error) {
	var rec runRecord
	if err := decodeJSONRecord(b, runVersion, &rec); err != nil {
		return nil, err
	}
	r := &engine.Run{
		ID: rec.ID, Thread: rec.Thread, Agent: rec.Agent, Status: rec.Status, Bundle: rec.Bundle,
		CorrelationID: rec.CorrelationID, Input: rec.Input, Output: rec.Output, Error: rec.Error,
		Checkpoint: rec.Checkpoint, Steps: rec.Steps, Durability: rec.Durability, Meta: rec.Meta,
		CreatedAt: rec.CreatedAt, StartedAt: rec.StartedAt, EndedAt: rec.EndedAt,
	}
	for _, in := range rec.Interrupts {
		r.Interrupts = append(r.Interrupts, engine.PendingInterrupt{
			ID: in.ID, Node: in.Node, NS: in.NS, TaskID: in.TaskID, Index: in.Index, Payload: in.Payload})
	}
	for _, dr := range rec.Decisions {
		r.Decisions = append(r.Decisions, engine.DecisionRecord{
			Interrupt: dr.Interrupt, Decision: dr.Decision, Value: dr.Value, Reason: dr.Reason, By: dr.By, At: dr.At})
	}
	return r, nil
}

func encodeJSONRecord(version byte, v any) ([]byte, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	b := beginRecord(version, len(payload))
	return seal(append(b, payload...)), nil
}

// decodeJSONRecord is strict: unknown fields and trailing data are errors,
// because a record this binary only half understands must not be trusted.
func decodeJSONRecord(b []byte, version byte, v any) error {
	payload, err := openRecord(b, version)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errTrailing
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errTrailing
	}
	return nil
}

// Run returns one run, or engine.ErrRunNotFound.
func (d *DB) Run(ctx context.Context, id string) (*engine.Run, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("load run %s: %w", id, err)
	}
	var out *engine.Run
	err := d.view(func(tx *bbolt.Tx) error {
		v := bucket(tx, bucketRuns).Get([]byte(id))
		if v == nil {
			return engine.ErrRunNotFound
		}
		r, err := decodeRun(v)
		if err != nil {
			return corrupt(bucketRuns, []byte(id), err)
		}
		out = r
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load run %s: %w", id, err)
	}
	return out, nil
}

// Runs lists runs in ID order (oldest first) that pass f's status, agent and
// thread, starting after f.After, at most f.Limit (0 for all).
func (d *DB) Runs(ctx context.Context, f engine.RunFilter) ([]*engine.Run, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	var out []*engine.Run
	err := d.view(func(tx *bbolt.Tx) error {
		c := bucket(tx, bucketRuns).Cursor()
		var k, v []byte
		if f.After == "" {
			k, v = c.First()
		} else if k, v = c.Seek([]byte(f.After)); k != nil && string(k) == f.After {
			k, v = c.Next()
		}
		for ; k != nil; k, v = c.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			r, err := decodeRun(v)
			if err != nil {
				return corrupt(bucketRuns, k, err)
			}
			if !f.Match(r) {
				continue
			}
			out = append(out, r)
			if f.Limit > 0 && len(out) == f.Limit {
				break
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	return out, nil
}
