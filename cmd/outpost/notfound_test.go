package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A run id that names no run said only "run not found", with no word of
// where it was looked for; an argument that is no run id at all (a thread
// name, a typo) got the same, with exit 1 as if the store had been read.
func TestRunArgumentThatNamesNoRun(t *testing.T) {
	data := filepath.Join(t.TempDir(), "clinic data")
	code, _, stderr := outpostBin(t, "", "run", "--data", data, "hello")
	require.Zero(t, code, stderr)
	before := folderTree(t, data)

	missing := "run_0000000000000001"
	for _, args := range [][]string{
		{"runs", "show", "--data", data, missing},
		{"runs", "replay", "--data", data, missing},
		{"resume", "--data", data, "--decision", "approve", missing},
	} {
		code, stdout, stderr := outpostBin(t, "", args...)
		require.Equal(t, 1, code, "%v: %s", args, stderr)
		require.Empty(t, stdout, args)
		require.Contains(t, stderr, "run "+missing+": run not found", args)
		require.Contains(t, stderr, "looked in the data folder "+data+";", args)
		require.Contains(t, stderr, "outpost runs list --data '"+data+"' lists the runs it holds", args)
		require.NotRegexp(t, usageHint, stderr, args)
	}
	for _, args := range [][]string{
		{"runs", "show", "--data", data, "t1"},
		{"runs", "replay", "--data", data, "0000000000000001"},
		{"resume", "--data", data, "--decision", "approve", "run_X"},
	} {
		code, stdout, stderr := outpostBin(t, "", args...)
		require.Equal(t, 2, code, "%v: %s", args, stderr)
		require.Empty(t, stdout, args)
		require.Contains(t, stderr, "is not a run id", args)
		require.Regexp(t, usageHint, stderr, args)
	}
	require.Equal(t, before, folderTree(t, data), "a run that is not there changes nothing")

	// The exit statuses that outpost help gives say so too.
	code, stdout, _ := outpostBin(t, "", "help")
	require.Zero(t, code)
	require.Contains(t, strings.Join(strings.Fields(stdout), " "), "a RUN that is not a run id), with nothing done")
}

// A bundle path that names nothing said so twice: "stat PATH: no such
// file or directory", then "(no such file or folder)".
func TestFirmwarePathThatNamesNothingSaidOnce(t *testing.T) {
	nope := filepath.Join(t.TempDir(), "nope")
	for _, sub := range []string{"install", "verify"} {
		code, _, stderr := outpostBin(t, "", "firmware", sub, "--data", t.TempDir(), "--trust-dev-key", nope)
		require.Equal(t, 1, code, stderr)
		require.Equal(t, "outpost firmware: read bundle: "+nope+": no such file or folder\n", stderr, sub)
	}
}

// Activating a version that is not installed said "open: bundle version
// not installed" and no more: it names the versions of the bundle that
// are installed, and how to install one.
func TestFirmwareActivateNamesTheInstalledVersions(t *testing.T) {
	dir := t.TempDir()
	data, bundle := filepath.Join(dir, "data"), filepath.Join(dir, "bundle")
	code, _, stderr := outpostBin(t, dir, "firmware", "export", bundle)
	require.Zero(t, code, stderr)

	// Nothing installed yet.
	code, _, stderr = outpostBin(t, dir, "run", "--data", data, "hello")
	require.Zero(t, code, stderr)
	code, _, stderr = outpostBin(t, dir, "firmware", "activate", "--data", data, "medication-adherence", "5")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "activate medication-adherence v5: bundle version not installed: nothing is installed in "+data)
	require.Contains(t, stderr, "outpost firmware install --data "+data+" --activate PATH")

	code, _, stderr = outpostBin(t, dir, "firmware", "install", "--data", data, "--trust-dev-key", bundle)
	require.Zero(t, code, stderr)
	before := folderTree(t, filepath.Join(data, "firmware"))
	code, stdout, stderr := outpostBin(t, dir, "firmware", "activate", "--data", data, "medication-adherence", "5")
	require.Equal(t, 1, code, stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, fmt.Sprintf("activate medication-adherence v5: bundle version not installed: installed versions of medication-adherence: v%d\n", embeddedVersion(t)))
	require.Contains(t, stderr, "outpost firmware install --data "+data+" --activate PATH")
	require.NotContains(t, stderr, "open:")

	code, _, stderr = outpostBin(t, dir, "firmware", "activate", "--data", data, "triage", "1")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "no version of triage is installed; installed bundles: medication-adherence\n")
	require.Equal(t, before, folderTree(t, filepath.Join(data, "firmware")), "a refused activate changes nothing")
}
