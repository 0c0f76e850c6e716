package policy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestApproval(t *testing.T) {
	read := Tool{Name: "kb_search", Kind: KindRead}
	note := Tool{Name: "record_note", Kind: KindWrite}
	follow := Tool{Name: "schedule_followup", Kind: KindWrite}
	odd := Tool{Name: "mystery", Kind: "exec"}
	rules := []ApprovalRule{
		{Tool: "record_note", Decision: DecisionAllow, Reason: "notes are reviewed daily"},
		{Tool: "kb_search", Decision: DecisionDeny, Reason: "kb offline"},
		{Tool: "*", Decision: DecisionAsk, Reason: "everything else asks"},
	}
	tests := []struct {
		name      string
		rules     []ApprovalRule
		tool      Tool
		untrusted bool
		want      Decision
		by        string
		reason    string
	}{
		{"read tool without rules", nil, read, false, DecisionAllow, "rule:default", "read tools"},
		{"write tool without rules asks", nil, note, false, DecisionAsk, "rule:default", "operator"},
		{"rule allows a write", rules, note, false, DecisionAllow, "rule:record_note", "notes are reviewed daily"},
		{"untrusted text turns allow into ask", rules, note, true, DecisionAsk, "rule:untrusted", "untrusted text"},
		{"untrusted, no rule: still ask", nil, follow, true, DecisionAsk, "rule:default", ""},
		{"untrusted does not stop reads", nil, read, true, DecisionAllow, "rule:default", ""},
		{"deny stands", rules, read, true, DecisionDeny, "rule:kb_search", "kb offline"},
		{"wildcard", rules, follow, false, DecisionAsk, "rule:*", "everything else asks"},
		{"named rule beats an earlier wildcard", []ApprovalRule{{Tool: "*", Decision: DecisionDeny}, {Tool: "record_note", Decision: DecisionAllow}}, note, false, DecisionAllow, "rule:record_note", "bundle rule says allow"},
		{"malformed rule denies", []ApprovalRule{{Tool: "record_note", Decision: "yes"}}, note, false, DecisionDeny, "rule:record_note", "malformed"},
		{"unknown kind is treated as a write", nil, odd, false, DecisionAsk, "rule:default", ""},
		{"unknown kind allowed by rule still asks when untrusted", []ApprovalRule{{Tool: "mystery", Decision: DecisionAllow}}, odd, true, DecisionAsk, "rule:untrusted", ""},
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, reason := Approval(tt.rules, tt.tool, tt.untrusted)
			assert.Equal(t, tt.want, d)
			assert.Contains(t, reason, tt.reason)
			rec := Decide(tt.rules, tt.tool, tt.untrusted, at)
			assert.Equal(t, ApprovalRecord{Tool: tt.tool.Name, Decision: d, By: tt.by, Reason: reason, At: at}, rec)
			switch d {
			case DecisionAllow:
				assert.NoError(t, rec.Err())
			case DecisionAsk:
				assert.ErrorIs(t, rec.Err(), ErrApprovalRequired)
			case DecisionDeny:
				assert.ErrorIs(t, rec.Err(), ErrToolDenied)
			}
		})
	}
}

func TestOperatorDecision(t *testing.T) {
	at := time.Now()
	rec, err := OperatorDecision("record_note", DecisionAllow, "nurse-7", "checked the note", at)
	require.NoError(t, err)
	assert.Equal(t, "operator:nurse-7", rec.By)
	assert.NoError(t, rec.Err())

	_, err = OperatorDecision("record_note", DecisionAsk, "nurse-7", "", at)
	assert.ErrorIs(t, err, ErrBadRule)
	_, err = OperatorDecision("record_note", DecisionDeny, "", "", at)
	assert.ErrorIs(t, err, ErrBadRule)
}

func TestApprovalRuleValidate(t *testing.T) {
	assert.NoError(t, ApprovalRule{Tool: "*", Decision: DecisionAsk}.Validate())
	assert.ErrorIs(t, ApprovalRule{Tool: "", Decision: DecisionAsk}.Validate(), ErrBadRule)
	assert.ErrorIs(t, ApprovalRule{Tool: "a", Decision: "maybe"}.Validate(), ErrBadRule)
}
