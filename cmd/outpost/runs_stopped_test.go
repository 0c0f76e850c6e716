package main

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// A run that a kill -9 cut short mid model call is stored as queued with
// no steps (its record is not rewritten at every step). runs show and
// runs list, reading the store with no process behind it, count its steps
// from its checkpoints and say that it stopped with the appliance and
// resumes at the next start; --json keeps the stored status and adds
// stopped.
func TestRunsShowsARunAStopCutShort(t *testing.T) {
	data := t.TempDir()
	killMidModelCall(t, data, "cut")
	id, status := runOnThread(t, data, "cut")

	code, stdout, stderr := outpostBin(t, "", "runs", "history", "--data", data, "--json", "cut")
	require.Equal(t, 0, code, stderr)
	var hist struct {
		Checkpoints []struct{ Run, Source string }
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &hist), stdout)
	steps := 0
	for _, c := range hist.Checkpoints {
		if c.Run == id && c.Source == engine.SourceLoop {
			steps++
		}
	}
	require.Positive(t, steps, stdout)

	code, stdout, stderr = outpostBin(t, "", "runs", "show", "--data", data, "--json", id)
	require.Equal(t, 0, code, stderr)
	var shown struct {
		Status  string
		Steps   int
		Stopped bool
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &shown), stdout)
	require.Equal(t, status, shown.Status, "the stored status stays as it is")
	require.Equal(t, steps, shown.Steps, stdout)
	require.True(t, shown.Stopped, stdout)

	code, stdout, stderr = outpostBin(t, "", "runs", "show", "--data", data, id)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^status +stopped: the run had started and stopped with the appliance`, stdout)
	require.Regexp(t, `(?m)^steps +`+strconv.Itoa(steps)+`$`, stdout)

	code, stdout, stderr = outpostBin(t, "", "runs", "list", "--data", data)
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, id+` +cut +\S+ +stopped +`+strconv.Itoa(steps)+` `, stdout)
	require.Contains(t, stdout, "it resumes at the next start")
}

// A run that a stop cut short while it was stored as queued is shown as
// stopped, and the status filter agrees: --status running lists it (as it
// lists one stored as running), --status queued does not.
func TestRunsListStatusFilterAgreesWithStopped(t *testing.T) {
	data := t.TempDir()
	killMidModelCall(t, data, "cut")
	id, status := runOnThread(t, data, "cut")
	require.Equal(t, string(engine.StatusQueued), status, "the run is stored as queued")

	listed := func(status string) (ids []string, stopped []bool) {
		t.Helper()
		code, stdout, stderr := outpostBin(t, "", "runs", "list", "--data", data, "--json", "--status", status)
		require.Equal(t, 0, code, stderr)
		var page struct {
			Runs []struct {
				ID      string
				Stopped bool
			}
		}
		require.NoError(t, json.Unmarshal([]byte(stdout), &page), stdout)
		for _, r := range page.Runs {
			ids, stopped = append(ids, r.ID), append(stopped, r.Stopped)
		}
		return ids, stopped
	}
	ids, stopped := listed("running")
	require.Equal(t, []string{id}, ids, "--status running lists the stopped run")
	require.Equal(t, []bool{true}, stopped)
	ids, _ = listed("queued")
	require.Empty(t, ids, "--status queued leaves out a run that had started")

	code, stdout, stderr := outpostBin(t, "", "runs", "list", "--data", data, "--status", "running")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, id+` +cut +\S+ +stopped `, stdout)

	// The word the STATUS column shows, given to --status, says where
	// such runs are listed.
	code, _, stderr = outpostBin(t, "", "runs", "list", "--data", data, "--status", "stopped")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "--status stopped: a run shown as stopped had started, and --status running lists it")
}
