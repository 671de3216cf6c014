package e2b

// Messages are the message types of the Connect services by their
// Protobuf full names, for the test that holds them to the SDK's own
// descriptors.
var Messages = map[string]any{
	"process.ProcessConfig":           processConfig{},
	"process.ProcessSelector":         processSelector{},
	"process.StartRequest":            startRequest{},
	"process.ProcessEvent":            processEvent{},
	"process.ProcessEvent.StartEvent": startEvent{},
	"process.ProcessEvent.DataEvent":  dataEvent{},
	"process.ProcessEvent.EndEvent":   endEvent{},
	"process.ProcessEvent.KeepAlive":  keepAlive{},
	"process.StartResponse":           startResponse{},
	"process.ListRequest":             listRequest{},
	"process.ProcessInfo":             processInfo{},
	"process.ListResponse":            listResponse{},
	"process.SendSignalRequest":       sendSignalRequest{},
	"process.SendSignalResponse":      sendSignalResponse{},
	"process.ConnectRequest":          connectRequest{},
	"process.ConnectResponse":         startResponse{},
	"filesystem.EntryInfo":            entryInfo{},
	"filesystem.StatRequest":          pathRequest{},
	"filesystem.ListDirRequest":       listDirRequest{},
	"filesystem.MakeDirRequest":       pathRequest{},
	"filesystem.RemoveRequest":        pathRequest{},
	"filesystem.MoveRequest":          moveRequest{},
	"filesystem.StatResponse":         entryResponse{},
	"filesystem.MakeDirResponse":      entryResponse{},
	"filesystem.MoveResponse":         entryResponse{},
	"filesystem.ListDirResponse":      listDirResponse{},
	"filesystem.RemoveResponse":       emptyResponse{},
}

// Routes are the Connect routes the API answers (served or
// unimplemented).
func (a *API) RPCRoutes() []string {
	var out []string
	for p := range a.rpcHandlers() {
		out = append(out, p)
	}
	return out
}
