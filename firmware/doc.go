// Package firmware reads, checks, installs and runs firmware bundles: the
// signed, versioned packages of agent graphs, prompts, knowledge base, tool
// registry, guardrail rules, model lanes and golden conversations that an
// appliance runs besides its binary.
//
// The entry points:
//
//   - Keygen makes an ed25519 key pair; Sign records every file's sha256 in
//     a bundle directory's manifest.json and signs the manifest's bytes
//     into manifest.sig.
//   - Verify checks a bundle (a directory, or a .tar of one) against a
//     Keyring of trusted keys, in an order that keeps unsigned bytes away
//     from every parser: the signature over the manifest's exact bytes,
//     then the manifest, then each listed file's sha256, then files the
//     manifest does not list. Load verifies, then compiles the bundle into
//     a *Bundle.
//   - Installer keeps verified bundles under DATA/firmware/NAME/VERSION/
//     with a small JSON index: Install (refusing downgrades unless allowed,
//     and recording them), Activate, Active, List, Open and Remove (which
//     needs who and why, and refuses a version a run still refers to).
//   - Resolver turns an Installer into an engine.Resolver: new runs get the
//     active version, resumed runs the exact version (and digest) they
//     were pinned to at start.
//   - Graph files are strict JSON or YAML (.yaml, .yml: a plain subset,
//     converted to JSON and decoded by the same strict decoder, errors at
//     the YAML's line and column), compiled into engine graphs from a fixed
//     set of node kinds (model, tool_loop, guardrail, retrieve, router,
//     review, template, fanout, subgraph) and
//     conditions (flag_set, flag_not_set, channel_empty,
//     channel_not_empty, counter_at_least, default). RegisterKind adds a Go
//     program's own kinds. README.md documents each kind with an example.
//   - Runtime is what model and tool_loop nodes run with (provider, model,
//     call log, blobs, budgets, the run's pinned active tool set);
//     LoadWithRuntime and InstallerOptions.Runtime pass it in.
//   - Reference loads the embedded, development-signed medication-adherence
//     bundle; Export writes it out.
//
// Errors wrap the sentinels in errors.go; problems inside a file are
// *FileError values naming the file, line, column and node.
//
// The tests are the best way to understand the package: start with
// TestPatterns, which runs one agent per execution pattern from the bundle
// in testdata/bundles/patterns, and TestPinnedRunResumesOnItsVersion.
package firmware
