package main

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/firmware"
)

// GET /api/v1/firmware listed the bundles as serve found them at its
// start, and not the copies of the embedded bundle kept for the runs
// pinned to it, which firmware list shows ("kept"). A run that pins the
// embedded bundle while serve runs makes its copy then: the API lists it
// at the next request, beside the bundles, as firmware list --json does.
func TestFirmwareAPIListsKeptCopies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	data := t.TempDir()
	s := startServe(t, buildOutpost(t), data)
	type listing struct {
		Bundles []struct {
			Name   string `json:"name"`
			Active bool   `json:"active"`
		} `json:"bundles"`
		Kept []firmware.Kept `json:"kept"`
	}
	get := func() listing {
		t.Helper()
		code, body := s.call(t, http.MethodGet, "/api/v1/firmware", "")
		require.Equal(t, http.StatusOK, code, "%s", body)
		var l listing
		require.NoError(t, json.Unmarshal(body, &l), "%s", body)
		require.NotEmpty(t, l.Bundles, "%s", body)
		return l
	}
	require.Empty(t, get().Kept, "no run has pinned the embedded bundle yet")

	code, body := s.call(t, http.MethodPost, "/api/v1/threads/t1/runs",
		`{"agent": "medication-adherence", "input": "I forgot my metformin dose", "wait": "20s"}`)
	require.Equal(t, http.StatusCreated, code, "%s", body)

	ref, err := firmware.Reference()
	require.NoError(t, err)
	got := get()
	require.Len(t, got.Kept, 1)
	require.Equal(t, ref.Ref(), got.Kept[0].BundleRef)
	require.Empty(t, got.Kept[0].Problem)
	require.Equal(t, ref.Ref().Name, got.Bundles[0].Name)
	s.stop(t)

	// What firmware list --json says of the same folder.
	code, stdout, stderr := outpostBin(t, "", "firmware", "list", "--data", data, "--json")
	require.Zero(t, code, stderr)
	var cli struct{ Kept []firmware.Kept }
	require.NoError(t, json.Unmarshal([]byte(stdout), &cli), stdout)
	require.Equal(t, cli.Kept, got.Kept)
}
