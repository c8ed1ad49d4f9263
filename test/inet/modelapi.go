package inet

// A stand-in for the model APIs the coding agents talk to: enough of
// Anthropic's Messages API and OpenAI's Responses API, streaming (SSE)
// included, for Claude Code and Codex to answer a prompt, with every
// request kept (Server.Requests) so a test can check which credential
// each carried and that no telemetry reached it. Everything it does not
// know answers 200 with an empty JSON object: an agent's side request
// (a feature flag, a profile) must not fail the run, and the request log
// shows it.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// ModelAPI answers as both model APIs; Answer is the text of every reply.
func ModelAPI(answer string) http.Handler {
	var seq atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		var req struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
		}
		json.Unmarshal(body, &req)
		id := seq.Add(1)
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/v1/messages/count_tokens"):
			writeJSONBody(w, map[string]any{"input_tokens": 10})
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/v1/messages"):
			anthropicMessage(w, req.Model, req.Stream, id, answer)
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/v1/responses"):
			openAIResponse(w, req.Model, req.Stream, id, answer)
		case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/models"):
			writeJSONBody(w, map[string]any{"object": "list", "data": []any{}, "models": []any{}})
		default:
			writeJSONBody(w, map[string]any{})
		}
	})
}

func writeJSONBody(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// sse writes one server-sent event and flushes it, so a client sees the
// stream arrive in pieces as from the real APIs.
func sse(w http.ResponseWriter, event string, data any) {
	b, _ := json.Marshal(data)
	if event != "" {
		fmt.Fprintf(w, "event: %s\n", event)
	}
	fmt.Fprintf(w, "data: %s\n\n", b)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// words splits the answer into the pieces a stream sends one by one.
func words(s string) []string {
	var out []string
	for i, f := range strings.SplitAfter(s, " ") {
		if f != "" || i == 0 {
			out = append(out, f)
		}
	}
	return out
}

func anthropicMessage(w http.ResponseWriter, model string, stream bool, id int64, answer string) {
	if model == "" {
		model = "stand-in"
	}
	msgID := fmt.Sprintf("msg_standin%d", id)
	usage := map[string]any{"input_tokens": 10, "output_tokens": len(words(answer))}
	if !stream {
		writeJSONBody(w, map[string]any{
			"id": msgID, "type": "message", "role": "assistant", "model": model,
			"content":     []any{map[string]any{"type": "text", "text": answer}},
			"stop_reason": "end_turn", "stop_sequence": nil, "usage": usage,
		})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	sse(w, "message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": msgID, "type": "message", "role": "assistant", "model": model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{"input_tokens": 10, "output_tokens": 1}}})
	sse(w, "content_block_start", map[string]any{"type": "content_block_start", "index": 0,
		"content_block": map[string]any{"type": "text", "text": ""}})
	for _, piece := range words(answer) {
		sse(w, "content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "text_delta", "text": piece}})
		time.Sleep(5 * time.Millisecond)
	}
	sse(w, "content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	sse(w, "message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil}, "usage": map[string]any{"output_tokens": usage["output_tokens"]}})
	sse(w, "message_stop", map[string]any{"type": "message_stop"})
}

func openAIResponse(w http.ResponseWriter, model string, stream bool, id int64, answer string) {
	if model == "" {
		model = "stand-in"
	}
	respID := fmt.Sprintf("resp_standin%d", id)
	itemID := fmt.Sprintf("msg_standin%d", id)
	item := map[string]any{"id": itemID, "type": "message", "role": "assistant", "status": "completed",
		"content": []any{map[string]any{"type": "output_text", "text": answer, "annotations": []any{}}}}
	usage := map[string]any{"input_tokens": 10, "input_tokens_details": map[string]any{"cached_tokens": 0},
		"output_tokens": len(words(answer)), "output_tokens_details": map[string]any{"reasoning_tokens": 0},
		"total_tokens": 10 + len(words(answer))}
	resp := func(status string, output []any) map[string]any {
		m := map[string]any{"id": respID, "object": "response", "created_at": time.Now().Unix(), "status": status,
			"model": model, "output": output}
		if status == "completed" {
			m["usage"] = usage
		}
		return m
	}
	if !stream {
		writeJSONBody(w, resp("completed", []any{item}))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	seq := 0
	ev := func(typ string, m map[string]any) {
		m["type"] = typ
		m["sequence_number"] = seq
		seq++
		sse(w, typ, m)
	}
	ev("response.created", map[string]any{"response": resp("in_progress", []any{})})
	ev("response.in_progress", map[string]any{"response": resp("in_progress", []any{})})
	ev("response.output_item.added", map[string]any{"output_index": 0, "item": map[string]any{
		"id": itemID, "type": "message", "role": "assistant", "status": "in_progress", "content": []any{}}})
	ev("response.content_part.added", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0,
		"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
	for _, piece := range words(answer) {
		ev("response.output_text.delta", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "delta": piece})
		time.Sleep(5 * time.Millisecond)
	}
	ev("response.output_text.done", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "text": answer})
	ev("response.content_part.done", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0,
		"part": map[string]any{"type": "output_text", "text": answer, "annotations": []any{}}})
	ev("response.output_item.done", map[string]any{"output_index": 0, "item": item})
	ev("response.completed", map[string]any{"response": resp("completed", []any{item})})
}
