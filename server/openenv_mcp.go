package server

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"

	"github.com/arbor-env/arbor/server/protocol"
)

// OpenEnv's MCP surface (its mcp_types.py, RFC 003): the step actions
// {"type": "list_tools"} and {"type": "call_tool", tool_name, arguments}
// that its MCPToolClient sends, and the "mcp" message carrying JSON-RPC
// tools/list and tools/call. The tools are the env's actions (bash,
// write_file, read_file, rollback, submit); a call is a step, so a turn
// of the episode, with its reward and done.

// The MCP action types of a step.
const (
	oeListTools = "list_tools"
	oeCallTool  = "call_tool"
)

// oeToolDef is one tool: an action of v1's action map.
type oeToolDef struct {
	name, description string
	required          []string
	props             map[string]any
}

var (
	jsonStr = map[string]any{"type": "string"}
	jsonNum = map[string]any{"type": "number"}
	jsonInt = map[string]any{"type": "integer"}
	jsonB   = map[string]any{"type": "boolean"}
)

// oeToolDefs are the tools, in the order listed; the action schema of
// /schema is made of them too.
var oeToolDefs = []oeToolDef{
	{"bash", "Run a shell command in the env's persistent shell (the working directory and exports carry over to the next call).",
		[]string{"cmd"}, map[string]any{"cmd": jsonStr, "timeout_s": jsonNum}},
	{"write_file", "Write a file (parent folders made); content is text, content_b64 base64 for bytes that are not.",
		[]string{"path"}, map[string]any{"path": jsonStr, "content": jsonStr, "content_b64": jsonStr, "timeout_s": jsonNum}},
	{"read_file", "Read a file: its content is the stdout (stdout_b64 when not UTF-8).",
		[]string{"path"}, map[string]any{"path": jsonStr, "timeout_s": jsonNum}},
	{"rollback", "Restore the env at a state of this episode (a state_id of an earlier observation's metadata).",
		[]string{"state_id"}, map[string]any{"state_id": jsonStr}},
	{oeSubmit, "End the episode: the task's verifier gives the reward.", nil, nil},
}

// schema is the tool's input schema; withTool adds the action's "tool"
// field (the step action of v1's action map).
func (d oeToolDef) schema(withTool bool) map[string]any {
	p := map[string]any{"max_output": jsonInt}
	maps.Copy(p, d.props)
	req := append([]string{}, d.required...)
	if withTool {
		p["tool"] = map[string]any{"const": d.name}
		req = append([]string{"tool"}, req...)
	}
	return map[string]any{"type": "object", "properties": p, "required": req}
}

func oeToolDefOf(name string) (oeToolDef, bool) {
	for _, d := range oeToolDefs {
		if d.name == name {
			return d, true
		}
	}
	return oeToolDef{}, false
}

// listTools answers the list_tools action: OpenEnv's ListToolsObservation
// {tools: [{name, description, input_schema}]}. It needs no reset and is
// no turn.
func (c *oeConn) listTools() any {
	tools := make([]map[string]any, len(oeToolDefs))
	for i, d := range oeToolDefs {
		tools[i] = map[string]any{"name": d.name, "description": d.description, "input_schema": d.schema(false)}
	}
	meta := map[string]any{"session_id": c.env}
	return map[string]any{"observation": map[string]any{"tools": tools, "metadata": meta}, "reward": nil, "done": c.over, "metadata": meta}
}

// toolError is OpenEnv's ToolError {error_type, message}: a call that
// could not be made (no such tool, bad arguments), as opposed to a
// command that failed (its exit code, in the result).
type toolError struct {
	Type    string `json:"error_type"`
	Message string `json:"message"`
}

// callTool answers the call_tool action {tool_name, arguments}: the
// action {tool: tool_name, ...arguments} as a step, answered as OpenEnv's
// CallToolObservation {tool_name, result, error}. A tool that does not
// exist or arguments it does not take are the observation's error
// (tool_not_found, invalid_args); what fails otherwise (no reset yet,
// the episode over, an infra failure) is an error answer as for a step.
func (c *oeConn) callTool(ctx context.Context, f map[string]any) (any, error) {
	name, _ := f["tool_name"].(string)
	answer := func(res oeResult, terr *toolError) any {
		meta := res.Observation.Metadata
		if meta.SessionID == "" {
			meta.SessionID = c.env
		}
		obs := map[string]any{"tool_name": name, "result": nil, "error": terr, "metadata": meta}
		if terr == nil {
			obs["result"] = oeToolResult(res, false)
		}
		return map[string]any{"observation": obs, "reward": res.Reward, "done": res.Done || c.over, "metadata": meta}
	}
	args, err := oeToolArgs(name, f["arguments"])
	if err != nil {
		return answer(oeResult{}, err), nil
	}
	res, serr := c.stepAction(ctx, args)
	if pe := protocol.ErrorOf(serr); pe != nil {
		if pe.Code != protocol.CodeInvalidParams {
			return nil, serr
		}
		return answer(res, &toolError{"invalid_args", pe.Message}), nil
	}
	return answer(res, nil), nil
}

// oeToolArgs makes the action of a call of tool name with arguments.
func oeToolArgs(name string, arguments any) (map[string]any, *toolError) {
	if _, ok := oeToolDefOf(name); !ok {
		return nil, &toolError{"tool_not_found", "no tool " + jsonQuote(name) + " (list_tools lists them)"}
	}
	args := map[string]any{}
	switch a := arguments.(type) {
	case nil:
	case map[string]any:
		args = maps.Clone(a)
	default:
		return nil, &toolError{"invalid_args", "arguments: want an object, got " + jsonKind(a)}
	}
	if _, ok := args["tool"]; ok {
		return nil, &toolError{"invalid_args", "arguments: no field tool (the tool is tool_name)"}
	}
	args["tool"] = name
	return args, nil
}

func jsonQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// oeToolResult is a call's result, as FastMCP's CallToolResult (the step
// action, snake_case as OpenEnv serialises it) or MCP's (the "mcp"
// message, camelCase): the output as text content, the observation's
// fields as data (what MCPToolClient.call_tool returns) and structured
// content, and is_error when the command failed.
func oeToolResult(res oeResult, camel bool) map[string]any {
	o := res.Observation
	data := map[string]any{"stdout": o.Stdout, "stderr": o.Stderr, "exit_code": o.ExitCode, "timed_out": o.TimedOut,
		"truncated": o.Truncated, "cwd": o.Cwd, "duration_s": o.DurationS}
	if o.StdoutB64 != "" {
		data["stdout_b64"] = o.StdoutB64
	}
	if o.StderrB64 != "" {
		data["stderr_b64"] = o.StderrB64
	}
	content := []map[string]any{{"type": "text", "text": o.Stdout}}
	if o.Stderr != "" {
		content = append(content, map[string]any{"type": "text", "text": o.Stderr})
	}
	isErr := o.ExitCode != 0 || o.TimedOut
	if camel {
		return map[string]any{"content": content, "structuredContent": data, "isError": isErr, "data": data,
			"_meta": map[string]any{"arbor": map[string]any{"reward": res.Reward, "done": res.Done, "metadata": o.Metadata}}}
	}
	return map[string]any{"content": content, "structured_content": data, "is_error": isErr, "data": data}
}

// rpcRequest is a JSON-RPC 2.0 request, the data of an "mcp" message.
type rpcRequest struct {
	JSONRPC string          `json:"jsonrpc"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
	ID      json.RawMessage `json:"id"`
}

// mcp answers an "mcp" message: JSON-RPC tools/list and tools/call, as
// OpenEnv's server does, with a JSON-RPC response (the answer's type is
// "mcp"; failures are JSON-RPC errors, with the endpoint's error data).
func (c *oeConn) mcp(ctx context.Context, raw json.RawMessage) any {
	var req rpcRequest
	if err := json.Unmarshal(raw, &req); err != nil || req.Method == "" {
		return rpcError(nil, rpcInvalidRequest, "invalid request: want a JSON-RPC 2.0 request {jsonrpc, method, params?, id}", nil)
	}
	id := req.ID
	switch req.Method {
	case "tools/list":
		tools := make([]map[string]any, len(oeToolDefs))
		for i, d := range oeToolDefs {
			tools[i] = map[string]any{"name": d.name, "description": d.description, "inputSchema": d.schema(false)}
		}
		return rpcResult(id, map[string]any{"tools": tools})
	case "tools/call":
		var p struct {
			Name      string `json:"name"`
			Arguments any    `json:"arguments"`
		}
		if len(bytes.TrimSpace(req.Params)) > 0 {
			d := json.NewDecoder(bytes.NewReader(req.Params))
			d.UseNumber()
			if err := d.Decode(&p); err != nil {
				return rpcError(id, rpcInvalidParams, "params: want {name, arguments}: "+err.Error(), nil)
			}
		}
		if p.Name == "" {
			return rpcError(id, rpcInvalidParams, "missing 'name' in params", nil)
		}
		args, terr := oeToolArgs(p.Name, p.Arguments)
		if terr != nil {
			return rpcError(id, rpcInvalidParams, terr.Message, map[string]any{"error_type": terr.Type})
		}
		res, err := c.stepAction(ctx, args)
		if err != nil {
			pe := protocol.ErrorOf(err)
			return rpcError(id, oeCodeOf(pe).rpc, pe.Message, oeErrorData(pe))
		}
		return rpcResult(id, oeToolResult(res, true))
	}
	return rpcError(id, rpcMethodNotFound, "method not found: "+req.Method+" (tools/list, tools/call)", nil)
}

func rpcResult(id json.RawMessage, result any) map[string]any {
	return map[string]any{"jsonrpc": "2.0", "id": rpcID(id), "result": result}
}

func rpcError(id json.RawMessage, code int, msg string, data any) map[string]any {
	e := map[string]any{"code": code, "message": msg}
	if data != nil {
		e["data"] = data
	}
	return map[string]any{"jsonrpc": "2.0", "id": rpcID(id), "error": e}
}

func rpcID(id json.RawMessage) any {
	if len(id) == 0 {
		return nil
	}
	return id
}

// discard (Arbor) closes the session's env, whichever made it (a branch
// child lives until discarded or the idle TTL); the connection stays,
// without a session until reset.
func (c *oeConn) discard(ctx context.Context) (any, error) {
	if err := c.needEnv(); err != nil {
		return nil, err
	}
	id := c.env
	wait, release := c.s.ticket(id)
	wait()
	err := c.s.closeEnv(ctx, id)
	release()
	c.s.oe.drop(id)
	if err != nil {
		return nil, err
	}
	c.oeSession = &oeSession{}
	return map[string]any{"session_id": id, "discarded": true}, nil
}
