package models_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/outpost-edge/outpost/models"
)

func TestTokenEstimates(t *testing.T) {
	for _, tc := range []struct {
		text string
		want int
	}{
		{"", 0},
		{"abcde", 2},        // a word is a token per 4 letters, rounded up
		{"I am a cat", 4},   // a short word is a whole token, and a space before it free
		{"12345678", 8},     // a digit a token
		{`{"a": 1}`, 7},     // a symbol a token: { " a " : 1 }
		{"二甲双胍", 6},         // 12 bytes of CJK: 1.5 a character
		{"метформин", 9},    // 18 bytes of Cyrillic: 1 a character
		{"👍", 2},            // 4 bytes
		{"café au lait", 4}, // caf, é (2 bytes), au, lait
		{"line\n\tnext", 4}, // line \n \t next
		{"   ", 0},          // spaces alone are free
	} {
		if got := models.EstimateTokens(tc.text); got != tc.want {
			t.Errorf("EstimateTokens(%q) = %d, want %d", tc.text, got, tc.want)
		}
	}

	req := models.Request{Messages: []models.Message{
		{Role: models.RoleSystem, Content: "take one"},
		{Role: models.RoleAssistant, ToolCalls: []models.ToolCall{{Name: "kb", Arguments: json.RawMessage(`{}`)}}},
	}, Tools: []models.ToolDef{{Name: "kb", Description: "search", Parameters: json.RawMessage(`{"type":"object"}`)}}}
	// 4+2 for the first message; 4+1+2 for the second; 1+2+(7 symbols, 1+2 for the words) for the tool.
	if got := models.EstimatePromptTokens(req); got != 26 {
		t.Fatalf("prompt estimate %d, want 26", got)
	}
	answer := models.Message{Content: "take one"}
	if got := models.Spent(req, 100, 7, answer); got != 107 {
		t.Fatalf("reported counts: %d, want 107", got)
	}
	if got := models.Spent(req, 0, 7, answer); got != 33 {
		t.Fatalf("missing prompt count: %d, want 26+7", got)
	}
	if got := models.Spent(req, 100, 0, answer); got != 102 {
		t.Fatalf("missing answer count: %d, want 100+2", got)
	}
}

// The estimate counts at least what the tokenizers of common models make
// of these texts: counted 4 bytes a token, Chinese came out below Llama
// 3's count, and digits, code and JSON below all of them. The counts were
// measured with the tokenizers of Llama 3 (llama3-tokenizer-js 1.2.0) and
// of OpenAI's cl100k_base and o200k_base (tiktoken 1.0.22).
func TestTokenEstimateIsAnUpperBoundInPractice(t *testing.T) {
	for _, tc := range []struct {
		name, text            string
		llama3, cl100k, o200k int
	}{
		{"en", "I forgot my metformin dose this morning, what should I do? If you missed a dose, take it as soon as you remember, unless it is almost time for your next dose. Do not take two doses at once to make up for a missed one.",
			54, 54, 53},
		{"en_short", "I am a cat. It is on a mat. Go to it, a b c d e f g.",
			23, 23, 23},
		{"digits", "Call 555-0123 or 0800 123 456 7890; dose 1000 mg at 08:30 on 2026-12-01, id 9f8e7d6c5b4a3210.",
			54, 54, 54},
		{"json", "{\"name\": \"kb_search\", \"arguments\": {\"query\": \"metformin missed dose\", \"limit\": 5, \"filters\": [\"adult\", \"type2\"]}}",
			37, 37, 36},
		{"code", "func main() {\n\tfor i := 0; i < 10; i++ {\n\t\tif x[i] != nil && y[i] >= 3 {\n\t\t\tfmt.Println(i, x[i]) // debug\n\t\t}\n\t}\n}\n",
			50, 50, 50},
		{"zh", "我今天早上忘记吃二甲双胍了，我该怎么办？如果您漏服了一剂，请在想起时尽快服用，除非快到下一剂的时间了。",
			45, 63, 43},
		{"ja", "今朝メトホルミンを飲み忘れました。どうすればいいですか？飲み忘れに気づいたらすぐに服用してください。",
			36, 52, 38},
		{"ko", "오늘 아침에 메트포르민을 복용하는 것을 잊었어요. 어떻게 해야 하나요? 생각나는 즉시 복용하세요.",
			32, 56, 32},
		{"hi", "मैं आज सुबह अपनी मेटफॉर्मिन की खुराक लेना भूल गया, मुझे क्या करना चाहिए?",
			37, 74, 22},
		{"th", "ฉันลืมกินยาเมตฟอร์มินเมื่อเช้านี้ ฉันควรทำอย่างไร",
			26, 45, 24},
		{"ar", "نسيت جرعة الميتفورمين هذا الصباح، ماذا أفعل؟ إذا فاتتك جرعة، تناولها بمجرد أن تتذكر.",
			37, 66, 31},
		{"ru", "Я забыл принять метформин сегодня утром, что мне делать? Если вы пропустили дозу, примите её как можно скорее.",
			32, 49, 29},
		{"zh_mixed", "请调用 kb_search 工具，参数为 {\"query\": \"二甲双胍 漏服\", \"limit\": 3}，然后用中文回答。剂量：500mg，每日2次。",
			44, 55, 44},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := models.EstimateTokens(tc.text)
			if most := max(tc.llama3, tc.cl100k, tc.o200k); got < most {
				t.Errorf("estimate %d, below the %d tokens it takes (Llama 3 %d, cl100k %d, o200k %d)",
					got, most, tc.llama3, tc.cl100k, tc.o200k)
			}
		})
	}
}

// Counted in pieces, a text counts as it does whole, wherever it was cut
// (in a word, in a character): a streamed answer is counted as it comes.
func TestTokenEstimateInPieces(t *testing.T) {
	text := "I forgot my metformin dose: 二甲双胍 500mg 👍, then\n\tcafé"
	want := models.EstimateTokens(text)
	for size := 1; size <= len(text); size++ {
		var e models.TextEstimate
		for i := 0; i < len(text); i += size {
			e.Add(text[i:min(i+size, len(text))])
		}
		if got := e.Tokens(); got != want {
			t.Fatalf("in pieces of %d bytes: %d tokens, want %d", size, got, want)
		}
	}

	var a models.AnswerEstimate
	msg := models.Message{Content: "Take it now", Thinking: "The user forgot",
		ToolCalls: []models.ToolCall{{Name: "kb_search", Arguments: json.RawMessage(`{"query":"dose"}`)}}}
	for _, w := range strings.SplitAfter(msg.Thinking, " ") {
		a.Add(models.Chunk{Thinking: w})
	}
	for _, w := range strings.SplitAfter(msg.Content, " ") {
		a.Add(models.Chunk{Content: w})
	}
	a.Add(models.Chunk{ToolCalls: msg.ToolCalls})
	if got, want := a.Tokens(), models.EstimateAnswerTokens(msg); got != want {
		t.Fatalf("streamed answer: %d tokens, want %d", got, want)
	}
}

func TestCutTokens(t *testing.T) {
	for _, tc := range []struct {
		text string
		n    int
		want string
	}{
		{"This may be an emergency", 3, "This may be "},
		{"This may be an emergency", 0, ""},
		{"二甲双胍", 3, "二甲"}, // 6 bytes, 3 tokens; a third character would make 5 (4.5 rounded up)
		{"short", 10, "short"},
		{"metformin", 2, "metformi"}, // 8 letters are 2 tokens, 9 are 3
	} {
		got := models.CutTokens(tc.text, tc.n)
		if got != tc.want {
			t.Errorf("CutTokens(%q, %d) = %q, want %q", tc.text, tc.n, got, tc.want)
		}
		if !utf8.ValidString(got) || models.EstimateTokens(got) > tc.n {
			t.Errorf("CutTokens(%q, %d) = %q: %d tokens", tc.text, tc.n, got, models.EstimateTokens(got))
		}
	}
}
