package tokens

// Samples for the known-value tests, written for this repository.
const (
	sampleEnglish = "The quick brown fox jumps over the lazy dog. Tokens are counted per encoding, and each encoding splits text differently. " +
		"A worker pulls a run request from the queue, loads the thread's checkpoint, and calls the model with the whole transcript. " +
		"When the context grows past the summarization threshold, older messages are compacted and summarized, so the run keeps going."
	sampleChinese = "自然语言处理是人工智能的一个重要分支，它研究如何让计算机理解和生成人类语言。" +
		"智能体在队列中领取任务，读取线程的检查点，然后携带完整的对话记录调用模型。" +
		"当上下文超过摘要阈值时，较早的消息会被压缩和总结，运行因此可以继续进行。"
	sampleJSON = `{"query":"weather in Paris","total":3,"results":[{"id":1,"title":"Paris forecast","url":"https://example.com/paris","temp_c":21.5,"ok":true},` +
		`{"id":2,"title":"Météo Paris","url":"https://example.com/meteo","temp_c":19,"ok":true},{"id":3,"title":"Île-de-France radar","url":"https://example.com/radar","temp_c":null,"ok":false}]}`
	sampleCode = "func (c *Cache) Message(m *model.Message) int {\n\tif m.ID == \"\" {\n\t\treturn Message(c.counter, m)\n\t}\n\tk := keyOf(m)\n\tc.mu.Lock()\n\te, ok := c.cur[k]\n\tif !ok {\n\t\tif e, ok = c.old[k]; ok {\n\t\t\tc.insert(k, e)\n\t\t}\n\t}\n\treturn e.n\n}\n"
)
