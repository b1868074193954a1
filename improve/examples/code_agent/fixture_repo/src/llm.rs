//! Model bindings: which providers exist and what a chat request holds.

/// The default number of tokens a reply may use.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// A request to a chat model.
pub struct ChatRequest {
    pub provider: Provider,
    pub system: String,
    pub messages: Vec<Message>,
    pub max_tokens: u32,
}

/// One message of a conversation.
pub struct Message {
    pub role: Role,
    pub content: String,
}

/// What a chat model answered.
pub struct ChatResponse {
    pub text: String,
    pub input_tokens: u32,
    pub output_tokens: u32,
}

/// The model providers tern can call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    Anthropic,
    OpenAi,
    Gemini,
    Ollama,
    OpenRouter,
    Mistral,
}

/// Who wrote a message.
pub enum Role {
    System,
    User,
    Assistant,
}

pub fn parse_provider(name: &str) -> Option<Provider> {
    match name {
        "anthropic" => Some(Provider::Anthropic),
        "openai" => Some(Provider::OpenAi),
        "gemini" => Some(Provider::Gemini),
        "ollama" => Some(Provider::Ollama),
        "openrouter" => Some(Provider::OpenRouter),
        "mistral" => Some(Provider::Mistral),
        _ => None,
    }
}
