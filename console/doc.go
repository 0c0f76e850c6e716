// Package console is the appliance's operator surface: the HTTP API of
// DESIGN.md ("HTTP API"), the event stream (a websocket, or Server-Sent
// Events on the same path), the embedded web page, and the bearer-token,
// Host and Origin checks in front of them.
//
// The entry points:
//
//   - New builds a *Server from a Config: the run manager, its store and
//     event bus, the token, the allowed host names, and what the appliance
//     knows about its bundles, model and uplink. Server.Handler serves
//     everything; Server.Close ends the event stream.
//   - LoadOrCreateToken makes the bearer token at first start (mode 0600
//     in the data folder) and ReadToken reads it for "outpost token".
//   - CheckListen refuses a non-loopback address without TLS.
//   - InstrumentStore wraps an engine.Store to time commits and count blob
//     bytes for /metrics.
//
// Beyond DESIGN.md, GET /api/v1/runs takes order=desc (or asc, the
// default): newest runs first, with "after" paging on towards older ones.
// The console page lists runs that way, so that the newest are one page
// however long the appliance's history. A run's interrupts carry "path"
// beside "node": node is the bare name of the node that asked, path its
// path through the subgraphs ("a/loop"), as events name it.
//
// The event stream speaks JSON messages. A websocket client authenticates
// with its first message, {"type":"auth","token":"..."}, or with the
// subprotocol "outpost.bearer.<token>" (never in the URL); it then sends
// {"type":"subscribe","thread"?,"run"?} and, to catch up after a
// reconnect, {"type":"resume","seq":N}; a message with a field of
// another name is answered with an "error", as a body is. The server sends the events of
// DESIGN.md ("Events") as they are, and control messages of the types
// "ready", "subscribed", "resumed", "window_exceeded" and "error" (no event
// type is one of these). The outcome.appended of a run that ends or
// pauses comes after the events of the step that ended or paused it. A
// client that falls behind by more than its queue is dropped with close
// code 1008 and a reason; the runtime never waits for it.
//
// The tests are the best way to understand the package: api_test.go drives
// every route, events_test.go the stream, browser_test.go the page in a
// headless Chromium.
package console
