package policy

import (
	"fmt"
	"time"
)

// Decision is what happens to a tool call that passed Check.
type Decision string

// Decisions.
const (
	DecisionAllow Decision = "allow" // run it
	DecisionAsk   Decision = "ask"   // pause the run for an operator (an engine interrupt)
	DecisionDeny  Decision = "deny"  // refuse it
)

// ApprovalRule is a bundle's standing decision for one tool. Tool is a tool
// name, or "*" for every tool not named by another rule.
type ApprovalRule struct {
	Tool     string   `json:"tool"`
	Decision Decision `json:"decision"`
	Reason   string   `json:"reason"`
}

// Validate reports a rule that cannot be applied.
func (r ApprovalRule) Validate() error {
	if r.Tool != "*" && !toolNameRE.MatchString(r.Tool) {
		return fmt.Errorf("%w: approval rule: tool %q is neither a tool name nor \"*\"", ErrBadRule, r.Tool)
	}
	switch r.Decision {
	case DecisionAllow, DecisionAsk, DecisionDeny:
		return nil
	}
	return fmt.Errorf("%w: approval rule for %q: decision must be allow, ask or deny, got %q", ErrBadRule, r.Tool, r.Decision)
}

// Approval decides whether a call to tool may run without a person.
//
//   - A rule naming the tool wins over a "*" rule; without either, read tools
//     are allowed and write tools ask.
//   - Deny always stands.
//   - Once untrusted text (a tool result, a retrieved document) has entered
//     the run, a write tool always asks, even where a rule says allow: the
//     text may have steered the model into the call.
//   - A malformed rule denies, whatever the tool's kind: a bundle should
//     never have loaded it, and guessing its intent could fail open.
//   - A tool of unknown kind is treated as a write tool.
func Approval(rules []ApprovalRule, tool Tool, untrusted bool) (Decision, string) {
	d, reason, _ := decide(rules, tool, untrusted)
	return d, reason
}

// decide is Approval, also saying who decided, for ApprovalRecord.By.
func decide(rules []ApprovalRule, tool Tool, untrusted bool) (Decision, string, string) {
	var match *ApprovalRule
	for i := range rules {
		r := &rules[i]
		if r.Tool == tool.Name {
			match = r
			break
		}
		if r.Tool == "*" && match == nil {
			match = r
		}
	}
	var d Decision
	var reason, by string
	switch {
	case match != nil && match.Validate() != nil:
		return DecisionDeny, fmt.Sprintf("approval rule for %q is malformed", match.Tool), "rule:" + match.Tool
	case match != nil:
		d, reason, by = match.Decision, match.Reason, "rule:"+match.Tool
		if reason == "" {
			reason = fmt.Sprintf("bundle rule says %s", d)
		}
	case tool.Kind == KindRead:
		d, reason, by = DecisionAllow, "read tools run without approval", "rule:default"
	default:
		d, reason, by = DecisionAsk, "write tools need an operator's approval", "rule:default"
	}
	if untrusted && tool.Kind != KindRead && d == DecisionAllow {
		d = DecisionAsk
		reason = "untrusted text has entered this run, so every write needs an operator's approval (a rule would have allowed it: " + reason + ")"
		by = "rule:untrusted"
	}
	return d, reason, by
}

// ApprovalRecord is the audit trail of one approval: what was decided, by
// whom and why. By is "rule:<tool or *>" (or "rule:default",
// "rule:untrusted") for decisions made by policy and "operator:<id>" for
// decisions made by a person.
type ApprovalRecord struct {
	Tool     string    `json:"tool"`
	Decision Decision  `json:"decision"`
	By       string    `json:"by"`
	Reason   string    `json:"reason"`
	At       time.Time `json:"at"`
}

// Decide applies Approval and returns its record.
func Decide(rules []ApprovalRule, tool Tool, untrusted bool, at time.Time) ApprovalRecord {
	d, reason, by := decide(rules, tool, untrusted)
	return ApprovalRecord{Tool: tool.Name, Decision: d, By: by, Reason: reason, At: at}
}

// OperatorDecision records a person's answer to an "ask". Only allow and
// deny are answers; an operator id is required so that no decision is
// anonymous.
func OperatorDecision(tool string, d Decision, operator, reason string, at time.Time) (ApprovalRecord, error) {
	if d != DecisionAllow && d != DecisionDeny {
		return ApprovalRecord{}, fmt.Errorf("%w: operator decision for %q must be allow or deny, got %q", ErrBadRule, tool, d)
	}
	if operator == "" {
		return ApprovalRecord{}, fmt.Errorf("%w: operator decision for %q has no operator", ErrBadRule, tool)
	}
	return ApprovalRecord{Tool: tool, Decision: d, By: "operator:" + operator, Reason: reason, At: at}, nil
}

// Err returns nil for allow, and otherwise an error for the caller to hand
// on: ErrApprovalRequired for ask, ErrToolDenied for deny.
func (r ApprovalRecord) Err() error {
	switch r.Decision {
	case DecisionAllow:
		return nil
	case DecisionAsk:
		return fmt.Errorf("%w: tool %q: %s", ErrApprovalRequired, r.Tool, r.Reason)
	}
	return fmt.Errorf("%w: tool %q denied by %s: %s", ErrToolDenied, r.Tool, r.By, r.Reason)
}
